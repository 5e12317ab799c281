"""``python -m benchmarks paper-curves | paper-curves-fitted``: run ``paper_curves.py``'s sweeps, write the
JSON, print the comparison, draw the two-panel plot.

Owns both commands (``add_arguments``, ``run``, ``result_file``: the default result file of each), their body
(``run_paper_curves``: the sweeps, a horizon check, the payload with the scenario, the profiles and the
paper's numbers beside every point), its printed tables and ``plot_curves`` (left: throughput relative to η =
0 against η, simulated and published; right: throughput against GPUs per model, context and arm, with linear
scaling from the smallest count)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from asyncrl.results import write_with_plot
from benchmarks.paper_curves import (
    PAPER,
    UNBOUNDED,
    CurvePoint,
    CurvesSpec,
    Runner,
    analyse,
    eta_points,
    fit_length_median,
    scaling_points,
    simulate_point,
    step_time_points,
)

DEFAULT_JSON = "docs/results/sim_paper_curves.json"
FITTED_JSON = "docs/results/sim_paper_curves_fitted.json"


def default_runner() -> Runner:
    from asyncrl.sim.run import simulate

    return simulate


def areal_workload() -> dict[str, Any]:
    """The ``areal-math`` workload of ``asyncrl plan`` (AReaL's math setup; lengths an assumption)."""
    from asyncrl.sim.plan_workloads import named_workloads

    return dict(named_workloads()["areal-math"].scenario)


def horizon_check(run: Runner, spec: CurvesSpec, eta: list[CurvePoint], scaling: list[CurvePoint]) -> list[dict]:
    """Two points simulated again over half their horizon: the η sweep's largest bounded η and the last
    scaling series' largest async point; how much the answer moves with the horizon."""
    bounded = [p for p in eta if p.max_staleness < UNBOUNDED and p.arm == "async"]
    chosen = [max(bounded, key=lambda p: p.max_staleness)] if bounded else []
    chosen += [p for p in scaling if p.arm == "async"][-1:]
    out = []
    for p in chosen:
        half = simulate_point(
            run,
            spec,
            "horizon",
            p.profile,
            p.gpus,
            p.max_new_tokens,
            p.arm,
            p.max_staleness,
            steps=max(2, p.steps // 2),
        )
        out.append(
            {
                "curve": p.curve,
                "profile": p.profile,
                "gpus": p.gpus,
                "max_new_tokens": p.max_new_tokens,
                "eta": p.eta_label,
                "steps": [half.steps, p.steps],
                "tokens_per_s": [half.tokens_per_s, p.tokens_per_s],
                "relative_change": p.tokens_per_s / half.tokens_per_s - 1 if half.tokens_per_s else None,
            }
        )
    return out


def run_paper_curves(
    spec: CurvesSpec, run: Runner | None = None, check_horizon: bool = True, command: str = ""
) -> dict[str, Any]:
    """Every sweep of ``spec``, analysed, as one JSON-ready payload."""
    from asyncrl.sim.profile import load_profile

    runner = run or default_runner()
    t0 = time.process_time()
    eta = eta_points(runner, spec)
    scaling = scaling_points(runner, spec)
    step = step_time_points(runner, spec, reuse=eta)
    profiles = sorted({spec.eta_profile, *spec.scaling_profiles, *(p for p, _ in spec.step_time_rows)})
    return {
        "command": command,
        "paper": PAPER,
        "spec": spec.to_dict(),
        "profiles": {name: load_profile(name).to_dict() for name in profiles},
        "points": [p.as_row() for p in (*eta, *scaling, *step)],
        "analysis": analyse(eta, scaling, step),
        "horizon_check": horizon_check(runner, spec, eta, scaling) if check_horizon else [],
        "cpu_s": time.process_time() - t0,
    }


def _fmt(x: float | None, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def print_curves(d: dict[str, Any]) -> None:
    a = d["analysis"]
    print(
        f"eta sweep ({d['spec']['eta_profile']}, {d['spec']['eta_gpus']} GPUs): sim / paper tokens/s, relative to "
        "eta = 0"
    )
    for r in a["eta"]["rows"]:
        print(
            f"  eta {r['eta']:>9}: {_fmt(r['sim_tokens_per_s']):>10} / {_fmt(r['paper_tokens_per_s']):>10} "
            f"(x{_fmt(r['ratio_sim_paper'], '.2f')}); relative {_fmt(r['sim_relative'], '.2f')} / "
            f"{_fmt(r['paper_relative'], '.2f')}"
        )
    e = a["eta"]
    print(
        f"  monotone: sim {e['sim_monotone']}, paper {e['paper_monotone']}; 95% plateau at eta "
        f"{e['sim_plateau_eta_95']} (sim) / {e['paper_plateau_eta_95']} (paper)"
    )
    print("step time (Table 1): s per step, sim / paper")
    for r in a["step_time"]:
        print(
            f"  {r['model']:>4} {r['gpus']} GPUs: sync {r['sim_sync_step_s']:.1f} / {r['paper_sync_step_s']:.1f}, "
            f"async (eta {r['eta']}) {r['sim_async_step_s']:.1f} / {r['paper_async_step_s']:.1f}; speed-up "
            f"{r['sim_speedup']:.2f} / {r['paper_speedup']:.2f}"
        )
    print("scaling: efficiency against linear, smallest -> largest GPU count")
    for r in a["scaling"]:
        speed = r.get("speedup_vs_sync-colocated", {})
        tail = f"; x{speed[str(r['to_gpus'])]:.2f} vs sync-colocated" if str(r["to_gpus"]) in speed else ""
        print(
            f"  {r['profile']:<10} {r['max_new_tokens']:>6} new  {r['arm']:<15} {r['from_gpus']}->{r['to_gpus']}: "
            f"{r['efficiency_smallest_to_largest']:.2f}{tail}"
        )
    for h in d["horizon_check"]:
        print(
            f"horizon: {h['curve']} {h['profile']} {h['gpus']} GPUs eta {h['eta']} at {h['steps'][0]} and "
            f"{h['steps'][1]} steps: {_fmt(h['tokens_per_s'][0])} and {_fmt(h['tokens_per_s'][1])} tokens/s "
            f"({h['relative_change']:+.1%})"
        )
    print(f"simulated in {d['cpu_s']:.0f} s of CPU")


def plot_curves(d: dict[str, Any], path: str | Path) -> Path:
    """Two panels: relative throughput against η (sim, paper); throughput against GPUs (sim, linear)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    rows = d["analysis"]["eta"]["rows"]
    xs = list(range(len(rows)))
    left.plot(
        xs,
        [r["sim_relative"] for r in rows],
        "o-",
        color="tab:blue",
        label=f"simulated ({d['spec']['eta_profile']}, {d['spec']['eta_gpus']} GPUs)",
    )
    paper = [(i, r["paper_relative"]) for i, r in enumerate(rows) if r["paper_relative"] is not None]
    left.plot([i for i, _ in paper], [v for _, v in paper], "s--", color="black", label="AReaL paper (1.5B)")
    left.set_xticks(xs, [r["eta"].replace("unbounded", "inf") for r in rows])
    left.set_xlabel("max staleness eta")
    left.set_ylabel("effective throughput / throughput at eta = 0")
    left.set_title("throughput against eta", fontsize=10)
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    styles = {"async": "-", "sync": ":", "sync-colocated": "--"}
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
    series = {(r["profile"], r["max_new_tokens"]) for r in d["analysis"]["scaling"]}
    for color, key in zip(colors, sorted(series), strict=False):
        for r in (x for x in d["analysis"]["scaling"] if (x["profile"], x["max_new_tokens"]) == key):
            g = [int(k) for k in r["tokens_per_s"]]
            v = list(r["tokens_per_s"].values())
            right.plot(
                g, v, styles[r["arm"]], marker="o", ms=3, color=color, label=f"{key[0]}, {key[1]:,} new, {r['arm']}"
            )
            if r["arm"] == "async":
                right.plot(g, [v[0] * x / g[0] for x in g], color=color, lw=0.6, alpha=0.5)
    right.plot([], [], color="grey", lw=0.6, label="linear from the smallest count (paper: AReaL near-linear)")
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel("GPUs")
    right.set_ylabel("simulated effective throughput (trained tokens/s)")
    right.set_title("strong scaling (the paper's points are in its figure only)", fontsize=10)
    right.grid(alpha=0.3, which="both")
    right.legend(fontsize=6, loc="upper left")
    from asyncrl.controller.report import save_figure

    return save_figure(fig, path)


PLOTTED = True
"""The plot is written beside the result file (its ``.png``)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json``, ``--steps``."""
    parser.add_argument("--json", help=f"write the result here (default {DEFAULT_JSON}; fitted: {FITTED_JSON})")
    parser.add_argument("--steps", type=int, help="the eta sweep's horizon in steps (default CurvesSpec.eta_steps)")


def result_file(args: argparse.Namespace) -> str:
    """``--json``, else the benchmark's default file under docs/results."""
    return args.json or (FITTED_JSON if args.benchmark == "paper-curves-fitted" else DEFAULT_JSON)


def run(args: argparse.Namespace) -> None:
    """The command of ``paper-curves`` or ``paper-curves-fitted`` (``args.benchmark``)."""
    bench_paper_curves(result_file(args), args.steps, fit_lengths=args.benchmark == "paper-curves-fitted")


def bench_paper_curves(json_path: str | None, steps: int | None, fit_lengths: bool = False) -> int:
    """``python -m benchmarks paper-curves [--json PATH] [--steps N]``: the JSON at PATH (default
    ``docs/results/sim_paper_curves.json``) and the plot beside it (``.png``); ``--steps`` sets the η
    sweep's horizon (the scaling sweep's is ``CurvesSpec.scaling_steps``). ``fit_lengths``
    (``python -m benchmarks paper-curves-fitted``, default ``..._fitted.json``): the workload's length median
    is first fitted to the paper's synchronous 1.5B step time (``fit_length_median``), the rest predicted."""
    spec = CurvesSpec(workload=areal_workload(), **({"eta_steps": steps} if steps else {}))
    name = "paper-curves-fitted" if fit_lengths else "paper-curves"
    target = Path(json_path or (FITTED_JSON if fit_lengths else DEFAULT_JSON))
    command = f"python -m benchmarks {name} --json {target}" + (f" --steps {steps}" if steps else "")
    fit = None
    if fit_lengths:
        row = PAPER["step_time"]["rows"][0]
        fit = fit_length_median(default_runner(), spec, row["sync_hours"] * 3.6)
        spec = CurvesSpec(**{**spec.to_dict(), "workload": {**spec.workload, "length_median": fit["length_median"]}})
        print(
            f"length median fitted to {fit['length_median']:,} tokens ({row['model']} synchronous step "
            f"{fit['target_step_s']:.1f} s on {row['gpus']} GPUs)"
        )
    payload = {**run_paper_curves(spec, command=command), "fit": fit}
    print_curves(payload)
    write_with_plot(target, json.dumps(payload, indent=2) + "\n", lambda png: plot_curves(payload, png))
    return 0


__all__ = [
    "CurvePoint",
    "add_arguments",
    "bench_paper_curves",
    "plot_curves",
    "print_curves",
    "result_file",
    "run",
    "run_paper_curves",
]
