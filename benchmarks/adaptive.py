"""``python -m benchmarks adaptive``: adaptive admission (``controller.adaptive``) against fixed settings.

Owns the comparison of issue 19 item 6: on each workload and seed, the fixed arms ``max_staleness``
= η for each η of ``--etas`` (the config's high-water mark) and the adaptive arm
(``controller.adaptive=true`` with the bound ``max_staleness = max(--etas)``: the user chooses neither
η nor the mark), side by side, seed-major so that load drift hits every arm.

Two modes:

- **real** (default): every arm is an ``asyncrl train`` run on the ``bench async`` workloads
  (``task``, ``long``; ``bench.async_bench.workload_overrides``), measured as ``bench async``
  measures (``runs.run_and_measure``: steady-state throughput from ``controller/throughput.py`` with a ``--warmup-s``
  window, the whole-run figure beside it, held-out ``accuracy_after``, ``controller/time_budget.py``);
- **simulated** (``--profile P[,P...]``): every arm is an ``asyncrl simulate`` run of
  ``sim.compare.SIM_WORKLOADS`` under each cost profile (``sim.compare.simulated_runner``, handed in
  as ``run_one``), the simulator seeds standing for ``--seeds``; the simulator drives the real gate
  and the real adaptive policy, trains no policy (no accuracy, no off-policy statistics) and
  measures throughput the same way.

``analyse`` (pure, on the rows): per workload, each arm's mean and 95% interval over seeds; the best
fixed arm by mean steady-state throughput; the adaptive arm's throughput over the best fixed one's
paired by seed (mean and 95% interval of the per-seed ratios); the accuracy difference paired by
seed; ``accuracy_within_spread``: the adaptive mean accuracy is at least the lowest per-seed accuracy
of the best fixed arm (None without accuracies); ``meets_target``: ratio mean ≥ ``TARGET_RATIO`` and
the accuracy within the spread (or unmeasured).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asyncrl.config import ConfigError
from asyncrl.data.workloads import WORKLOAD_ALIASES, WORKLOADS
from benchmarks import options
from benchmarks.options import (
    add_json,
    add_out,
    add_overrides,
    add_reuse,
    add_seeds,
    add_steps,
    add_warmup,
    parse_list,
)
from benchmarks.stats import mean_ci95

__all__ = ["add_arguments", "analyse", "arms", "run", "run_adaptive_bench", "RunOne", "TARGET_RATIO"]

TARGET_RATIO = 0.95
"""The issue's bar: adaptive throughput at least this fraction of the best fixed setting's."""

SUMMARY_KEYS = (
    "steady_state_tokens_per_s",
    "trained_tokens_per_s",
    "accuracy_after",
    "staleness_mean",
    "eta_mean",
    "high_water_mean",
    "stale_groups",
)

RunOne = Callable[[str, str, int, list[str]], dict[str, Any]]
"""``(workload, arm, seed, arm overrides) -> row figures``: one measured run (real or simulated)."""


def arms(etas: tuple[int, ...]) -> list[tuple[str, list[str]]]:
    """(name, overrides) of each arm: the fixed ones, then adaptive with the bound max(etas)."""
    if not etas or min(etas) < 0:
        raise ValueError(f"--etas must be values >= 0, got {list(etas)}")
    fixed = [(f"eta={e}", [f"controller.max_staleness={e}"]) for e in etas]
    return [*fixed, ("adaptive", [f"controller.max_staleness={max(etas)}", "controller.adaptive=true"])]


def _values(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in rows if r.get(key) is not None]


def analyse(rows: list[dict[str, Any]], target: float = TARGET_RATIO) -> list[dict[str, Any]]:
    """The comparison per workload (module docstring); rows carry ``workload``, ``arm``, ``seed``."""
    out = []
    for workload in dict.fromkeys(r["workload"] for r in rows):
        w_rows = [r for r in rows if r["workload"] == workload]
        by_arm: dict[str, list[dict[str, Any]]] = {}
        for r in w_rows:
            by_arm.setdefault(r["arm"], []).append(r)
        summary = {arm: {k: mean_ci95(_values(rs, k)) for k in SUMMARY_KEYS} for arm, rs in by_arm.items()}
        fixed = [a for a in by_arm if a != "adaptive"]
        item: dict[str, Any] = {"workload": workload, "arms": summary}
        if not fixed or "adaptive" not in by_arm:
            out.append(item)
            continue
        best = max(fixed, key=lambda a: summary[a]["steady_state_tokens_per_s"]["mean"] or 0.0)
        item["best_fixed"] = best
        ratios, deltas = _paired(by_arm["adaptive"], by_arm[best])
        item["throughput_ratio_vs_best"] = mean_ci95(ratios)
        item["accuracy_delta_vs_best"] = mean_ci95(deltas)
        best_acc = _values(by_arm[best], "accuracy_after")
        adaptive_acc = _values(by_arm["adaptive"], "accuracy_after")
        within = statistics.fmean(adaptive_acc) >= min(best_acc) if best_acc and adaptive_acc else None
        item["accuracy_within_spread"] = within
        ratio = item["throughput_ratio_vs_best"]["mean"]
        item["meets_target"] = ratio is not None and ratio >= target and within is not False
        item["target_ratio"] = target
        out.append(item)
    return out


def _paired(adaptive: list[dict[str, Any]], best: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """Per seed present in both: adaptive / best steady-state throughput, adaptive - best accuracy."""
    best_by_seed = {r["seed"]: r for r in best}
    ratios, deltas = [], []
    for r in adaptive:
        b = best_by_seed.get(r["seed"])
        if b is None:
            continue
        if r.get("steady_state_tokens_per_s") and b.get("steady_state_tokens_per_s"):
            ratios.append(r["steady_state_tokens_per_s"] / b["steady_state_tokens_per_s"])
        if r.get("accuracy_after") is not None and b.get("accuracy_after") is not None:
            deltas.append(r["accuracy_after"] - b["accuracy_after"])
    return ratios, deltas


def admission_means(run_dir: Path, overrides: list[str]) -> dict[str, float]:
    """η and the mark in force, averaged over a real run's steps (adaptive: the chosen ones)."""
    from asyncrl.config import load_config
    from asyncrl.controller.adaptive import setting_means
    from asyncrl.controller.rundir import read_jsonl

    c = load_config(None, overrides).controller
    return setting_means(read_jsonl(run_dir / "metrics.jsonl"), c.max_staleness, c.high_water_batches)


def run_adaptive_bench(
    json_path: str | None,
    *,
    workloads: tuple[str, ...] = ("task", "long"),
    etas: tuple[int, ...] = (0, 2, 4, 8),
    seeds: tuple[int, ...] = (0, 1, 2),
    steps: int | None = None,
    warmup_s: float = 60.0,
    overrides: list[str] | None = None,
    out_dir: str = "runs/bench-adaptive",
    run_one: RunOne | None = None,
    mode: str = "real",
    profiles: tuple[str, ...] = (),
    reuse: str | None = None,
) -> dict[str, Any]:
    """Every arm on every workload and seed (module docstring). ``run_one``: the runs (None: real
    ``asyncrl train`` runs; the simulated runner, ``mode="simulated"``, whose ``workloads`` are then
    ``profile/workload`` keys; or a stand-in in the tests). ``reuse``: an interrupted invocation's directory
    (``<out>/<timestamp>``) whose finished runs of the same arm and config are measured again, not trained (their
    rows say ``reused``)."""
    from benchmarks.runs import print_table, write_json

    base = list(overrides or []) + ([f"controller.total_steps={steps}"] if steps is not None else [])
    runner, out = run_one, None
    if runner is None:
        runner, out = _real_runner(base, warmup_s, out_dir, Path(reuse) if reuse else None)
    rows: list[dict[str, Any]] = []
    for key in workloads:
        for seed in seeds:
            for arm, arm_overrides in arms(etas):
                print(f"\n=== bench adaptive: {key}, seed {seed}, {arm} ===", flush=True)
                figures = runner(key, arm, seed, arm_overrides)
                rows.append(
                    {
                        "workload": key,
                        "arm": arm,
                        "seed": seed,
                        "adaptive": arm == "adaptive",
                        "max_staleness": max(etas) if arm == "adaptive" else int(arm[4:]),
                        **figures,
                    }
                )
    analysis = analyse(rows)
    print_table(
        "bench adaptive: runs",
        rows,
        [
            "workload",
            "arm",
            "seed",
            "steady_state_tokens_per_s",
            "accuracy_after",
            "staleness_mean",
            "eta_mean",
            "high_water_mean",
            "stale_groups",
        ],
    )
    for item in analysis:
        ratio = item.get("throughput_ratio_vs_best", {})
        print(
            f"{item['workload']}: best fixed {item.get('best_fixed')}, adaptive / best {ratio.get('mean')} "
            f"[{ratio.get('low')}, {ratio.get('high')}], accuracy within spread {item.get('accuracy_within_spread')}"
            f", meets the {TARGET_RATIO} target: {item.get('meets_target')}"
        )
    payload = {
        "bench": "adaptive",
        "mode": mode,
        "profiles": list(profiles),
        "workloads": list(workloads),
        "etas": list(etas),
        "bound": max(etas),
        "seeds": list(seeds),
        "steps": steps,
        "warmup_s": warmup_s,
        "overrides": base,
        "rows": rows,
        "analysis": analysis,
        "out_dir": str(out) if out else None,
        "reused_from": reuse,
    }
    write_json(json_path, payload)
    return payload


def _real_runner(base: list[str], warmup_s: float, out_dir: str, reuse: Path | None) -> tuple[RunOne, Path]:
    from benchmarks.async_bench import workload_overrides
    from benchmarks.runs import fresh_out, measure_or_reuse

    out = fresh_out(out_dir)

    def run(workload: str, arm: str, seed: int, arm_overrides: list[str]) -> dict[str, Any]:
        overrides = [*workload_overrides(base, workload), f"run.seed={seed}", *arm_overrides]
        run_dir = out / f"{workload}-s{seed}-{arm.replace('=', '')}"
        row = measure_or_reuse(overrides, run_dir, warmup_s, reuse, "adaptive")
        measured = reuse / run_dir.name if row.get("reused") and reuse is not None else run_dir
        return {**row, **admission_means(measured, overrides)}

    return run, out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arms (``--etas``, ``--seeds``, ``--workload``), real runs (``--set``, ``--model``, ``--steps``,
    ``--warmup-s``, ``--out``, ``--reuse``) or simulated ones (``--profile``)."""
    add_json(parser)
    add_overrides(parser)
    add_steps(parser, "training steps per run (default: the config's; simulated: 100)")
    parser.add_argument(
        "--etas",
        help="comma-separated max_staleness of the fixed arms (default 0,2,4,8); the largest is the "
        "adaptive arm's bound",
    )
    add_seeds(parser, "0,1,2")
    parser.add_argument("--workload", default="task,long", help="comma-separated workloads (default task,long)")
    add_warmup(parser)
    add_out(parser, "runs/bench-adaptive")
    add_reuse(parser)
    parser.add_argument("--profile", help="comma-separated cost profiles to simulate under instead of real runs")


def run(args: argparse.Namespace) -> None:
    """The arms checked, then real runs or, with ``--profile``, simulated ones (``adaptive_sim``)."""
    etas = parse_list(args.etas, int, (0, 2, 4, 8), "--etas")
    seeds = parse_list(args.seeds, int, (0, 1, 2), "--seeds")
    try:
        arms(etas)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    workloads = tuple(WORKLOAD_ALIASES.get(w, w) for w in args.workload.split(","))
    common = dict(etas=etas, seeds=seeds, steps=args.steps, warmup_s=args.warmup_s, out_dir=args.out)
    if not args.profile:
        unknown = sorted(set(workloads) - set(WORKLOADS))
        if unknown:
            raise ConfigError(f"unknown workload(s) {unknown} (available: {', '.join(WORKLOADS)})")
        run_adaptive_bench(
            args.json, workloads=workloads, overrides=options.overrides(args), reuse=args.reuse, **common
        )
        return
    from benchmarks.adaptive_sim import SIM_WORKLOADS, simulated_runner

    unknown = sorted(set(workloads) - set(SIM_WORKLOADS))
    if unknown:
        raise ConfigError(f"unknown workload(s) {unknown} (simulated: {', '.join(SIM_WORKLOADS)})")
    profiles = tuple(args.profile.split(","))
    keys = tuple(f"{p}/{w}" for p in profiles for w in workloads)
    run_adaptive_bench(
        args.json,
        workloads=keys,
        run_one=simulated_runner(args.steps or 100),
        mode="simulated",
        profiles=profiles,
        **common,
    )
