"""``python -m benchmarks plan-check``: does ``asyncrl plan``'s recommendation hold up when run for real?

Owns the choice of settings to run from a plan file (``asyncrl plan --json``), the runs themselves (real
``asyncrl train`` runs of the plan's workload, ``bench.async_bench``'s runner: the same model, data and
seeds, seed-major so that load drift hits every setting) and the analysis: measured throughput per setting
(mean and 95% interval over seeds), the best measured setting, the recommendation's ratio to it (and per
seed), whether it is within ``tolerance`` (default 10%: issue 19's acceptance), and each setting's
predicted against measured throughput.

Settings run (``settings_to_run``): the recommendation, the candidate predicted fastest, and the candidate
predicted fastest at each η of the plan (a sweep over the main axis), at most ``max_settings`` in all
(the recommendation always among them). The plan must be of a workload this machine runs
(``bench async``'s ``task`` or ``long``) and a split of one engine and one trainer rank (the local launcher).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from asyncrl.config import ConfigError
from benchmarks import options
from benchmarks.options import add_json, add_out, add_overrides, add_seeds, add_steps, add_warmup, parse_list
from benchmarks.stats import mean_ci95

__all__ = ["add_arguments", "analyse", "run", "run_plan_check", "settings_to_run"]

MEASURES = ("steady_state_tokens_per_s", "trained_tokens_per_s")
"""The throughput compared: the steady-state window (DESIGN §8) when every run has one, else the whole run."""


class PlanCheckError(ValueError):
    """A plan this bench cannot check on this machine (the message says why)."""


def settings_to_run(plan: dict[str, Any], max_settings: int = 6) -> list[dict[str, Any]]:
    """The plan's candidates to run for real (module docstring), recommendation first."""
    if max_settings < 1:
        raise PlanCheckError("--max-settings must be >= 1")
    rows = sorted(plan["candidates"], key=lambda r: -r["steady_state_tokens_per_s"])
    picked: dict[str, dict[str, Any]] = {plan["recommended"]["label"]: plan["recommended"]}
    picked.setdefault(rows[0]["label"], rows[0])
    for eta in sorted({r["max_staleness"] for r in rows}):
        best_at = next(r for r in rows if r["max_staleness"] == eta)
        picked.setdefault(best_at["label"], best_at)
    return list(picked.values())[:max_settings]


def check_plan(plan: dict[str, Any]) -> str:
    """The ``bench async`` workload the plan's runs use; raises ``PlanCheckError`` for a plan this machine
    cannot run."""
    workload = plan.get("workload", {}).get("bench_workload")
    if not workload:
        raise PlanCheckError(
            f"plan of workload {plan.get('workload', {}).get('name')!r} has no real-run config: plan a workload "
            "this machine runs (asyncrl plan --workload task|long)"
        )
    ray = [r["label"] for r in plan["candidates"] if r["recommended"] and "launch.kind=ray" in r["overrides"]]
    if ray:
        raise PlanCheckError(f"the recommendation {ray[0]} needs the Ray launcher: plan with --devices 2 here")
    return workload


def analyse(rows: list[dict[str, Any]], recommended: str, tolerance: float = 0.10) -> dict[str, Any]:
    """Per setting (label) over seeds: measured throughput (mean, 95% interval), predicted throughput and
    its error; the best measured setting; the recommendation's ratio to it (of the means, and paired by
    seed) and whether it is within ``tolerance``."""
    measure = MEASURES[0] if all(r.get(MEASURES[0]) is not None for r in rows) else MEASURES[1]
    labels = list(dict.fromkeys(r["label"] for r in rows))
    if recommended not in labels:
        raise PlanCheckError(f"no run of the recommended setting {recommended!r}")
    per: list[dict[str, Any]] = []
    for label in labels:
        runs = [r for r in rows if r["label"] == label]
        measured = [float(r[measure]) for r in runs]
        predicted = runs[0]["predicted_tokens_per_s"]
        mean = statistics.fmean(measured)
        per.append(
            {
                "label": label,
                "recommended": label == recommended,
                "seeds": [r["seed"] for r in runs],
                "measured": mean_ci95(measured),
                "predicted_tokens_per_s": predicted,
                "prediction_error": predicted / mean - 1.0 if mean > 0 else None,
                "staleness_mean_measured": statistics.fmean(r["staleness_mean"] for r in runs),
                "staleness_mean_predicted": runs[0]["predicted_staleness_mean"],
            }
        )
    best = max(per, key=lambda p: p["measured"]["mean"])
    rec = next(p for p in per if p["recommended"])
    ratio = rec["measured"]["mean"] / best["measured"]["mean"] if best["measured"]["mean"] > 0 else 0.0
    by_seed = {(r["label"], r["seed"]): float(r[measure]) for r in rows}
    paired = [
        by_seed[(recommended, s)] / by_seed[(best["label"], s)]
        for s in rec["seeds"]
        if (best["label"], s) in by_seed and by_seed[(best["label"], s)] > 0
    ]
    return {
        "measure": measure,
        "settings": per,
        "best_measured": best["label"],
        "recommended": recommended,
        "recommended_over_best": ratio,
        "recommended_over_best_paired": mean_ci95(paired),
        "tolerance": tolerance,
        "within_tolerance": ratio >= 1.0 - tolerance,
    }


def run_plan_check(
    json_path: str | None,
    plan_path: str,
    *,
    overrides: list[str] | None = None,
    seeds: tuple[int, ...] = (0, 1),
    steps: int | None = None,
    warmup_s: float = 60.0,
    max_settings: int = 6,
    tolerance: float = 0.10,
    out_dir: str = "runs/bench-plan-check",
) -> dict[str, Any]:
    """Run the plan's settings (``settings_to_run``) for real, each seed, and analyse them."""
    from benchmarks.async_bench import workload_overrides
    from benchmarks.runs import fresh_out, print_table, run_and_measure, write_json

    plan = json.loads(Path(plan_path).read_text())
    workload = check_plan(plan)
    settings = settings_to_run(plan, max_settings)
    base = list(overrides or []) + ([f"controller.total_steps={steps}"] if steps is not None else [])
    wl = workload_overrides(base, workload)
    out = fresh_out(out_dir)
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        for i, s in enumerate(settings):
            print(f"\n=== bench plan-check: {workload}, seed {seed}, {s['label']} ===", flush=True)
            run = run_and_measure([*wl, *s["overrides"], f"run.seed={seed}"], out / f"s{seed}-{i}", warmup_s)
            rows.append(
                {
                    "label": s["label"],
                    "seed": seed,
                    "overrides": s["overrides"],
                    "max_staleness": s["max_staleness"],
                    "high_water_batches": s["high_water_batches"],
                    "interrupt_mode": s["interrupt_mode"],
                    "predicted_tokens_per_s": s["steady_state_tokens_per_s"],
                    "predicted_staleness_mean": s["staleness_mean"],
                    **run,
                }
            )
    analysis = analyse(rows, plan["recommended"]["label"], tolerance)
    keys = [
        "label",
        "seed",
        "steady_state_tokens_per_s",
        "trained_tokens_per_s",
        "predicted_tokens_per_s",
        "staleness_mean",
        "rl_wall_s",
    ]
    print_table("bench plan-check: runs", rows, keys)
    verdict = "within" if analysis["within_tolerance"] else "NOT within"
    print(
        f"\nrecommended {analysis['recommended']}: {analysis['recommended_over_best']:.3f} of the best measured "
        f"({analysis['best_measured']}, by {analysis['measure']}): {verdict} {tolerance:.0%}"
    )
    payload = {
        "bench": "plan-check",
        "plan": plan_path,
        "plan_rule": plan["rule"],
        "profile": plan["profile"],
        "workload": workload,
        "overrides": base,
        "seeds": list(seeds),
        "warmup_s": warmup_s,
        "rows": rows,
        "analysis": analysis,
        "out_dir": str(out),
    }
    write_json(json_path, payload)
    return payload


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--plan`` (required), ``--max-settings``, the runs (``--set``, ``--model``, ``--steps``, ``--seeds``,
    ``--warmup-s``, ``--out``), ``--json``."""
    add_json(parser)
    parser.add_argument("--plan", help="the plan file to check (asyncrl plan --json PLAN.json)")
    parser.add_argument("--max-settings", type=int, default=6, help="settings to run (default 6)")
    add_overrides(parser)
    add_steps(parser)
    add_seeds(parser, "0,1")
    add_warmup(parser)
    add_out(parser, "runs/bench-plan-check")


def run(args: argparse.Namespace) -> None:
    """The plan's settings run for real."""
    if not args.plan:
        raise ConfigError("needs --plan PLAN.json (written by asyncrl plan --json)")
    seeds = parse_list(args.seeds, int, (0, 1), "--seeds")
    try:
        run_plan_check(
            args.json,
            args.plan,
            overrides=options.overrides(args),
            seeds=seeds,
            steps=args.steps,
            warmup_s=args.warmup_s,
            max_settings=args.max_settings,
            out_dir=args.out,
        )
    except PlanCheckError as exc:
        raise ConfigError(str(exc)) from exc
