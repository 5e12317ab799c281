"""``python -m benchmarks sim-validate``: the simulator's predictions against measured runs.

Owns the comparison and its command (``add_arguments``, ``run``: the table printed, the JSON to ``--json``).
For each real run directory, the prediction is ``simulate(from_run(run))`` (the run's own config, its ledger's
lengths replayed, its filter rate and prompt length) under one cost profile, averaged over simulator seeds;
the measurement is read from the run's files with the same definitions the simulator reports:

- **effective throughput**: ``controller.throughput.measure_throughput`` (generated tokens in the
  steady-state window x trained per generated), the window opening at the end of the same step
  on both sides (``sim.output.warmup_s``: a tenth of the steps unless the scenario says);
- **mean staleness**: over trained groups, ``step - the group's oldest version`` (the per-step
  ``staleness_hist`` of ``metrics.jsonl``; the simulator's recorder uses the same definition);
- **engine occupancy**: the time average of the engine's running sequences over its slots, up to
  the last step: exact from the engine's own integral (``timeline.jsonl``'s
  ``engine_running_sample_s``, counted by ``LocalEngine``) where every line carries it, else from
  ``engine_running`` held constant between the lines (0.25 s apart: a count that swings between 0
  and the slot limit inside one interval makes this estimate move by about 10%).

Calibration and validation are kept apart: a profile refined from runs (``--from-runs``) may not
be refined from a run it is then asked to predict. The error of a figure is
``(predicted - measured) / measured``; a run passes when every figure is within ``tolerance``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from asyncrl.config import ConfigError, load_config
from asyncrl.controller.rundir import read_jsonl
from asyncrl.controller.throughput import measure_throughput
from asyncrl.controller.time_budget import held_integral
from asyncrl.results import write_text_result
from asyncrl.sim.output import warmup_s
from asyncrl.sim.profile import CostProfile
from asyncrl.sim.run import simulate
from asyncrl.sim.scenario import Scenario, from_run
from benchmarks.options import add_json, add_seeds, parse_list

__all__ = ["FIGURES", "Figures", "add_arguments", "measured_figures", "predicted_figures", "run", "validate_runs"]

FIGURES = ("throughput", "staleness_mean", "engine_occupancy")
"""The figures compared, in the order of the table."""


@dataclass(frozen=True)
class Figures:
    """The three compared figures of one run (measured) or one simulation (predicted)."""

    throughput: float
    """Steady-state effective throughput, trained tokens per second."""
    staleness_mean: float
    """Mean over trained groups of ``step - oldest version``."""
    engine_occupancy: float
    """Mean running sequences over the engine's slots (all engines)."""


def _occupancy(timeline: Sequence[dict[str, Any]], end_s: float, slots: int) -> float:
    """Time average of ``engine_running / slots`` over ``[0, end_s]``: from the engine's integral between
    the first line and the last one at or before ``end_s`` when every line has it, else each line's
    count held until the next."""
    if slots <= 0 or end_s <= 0:
        return 0.0
    counted = sorted(
        (float(s["t"]), float(s["engine_running_sample_s"]))
        for s in timeline
        if s.get("engine_running_sample_s") is not None and float(s["t"]) <= end_s
    )
    if timeline and len(counted) == sum(1 for s in timeline if float(s["t"]) <= end_s) and len(counted) >= 2:
        (t0, c0), (t1, c1) = counted[0], counted[-1]
        if t1 > t0:
            return (c1 - c0) / ((t1 - t0) * slots)
    points = sorted((float(s["t"]), float(s.get("engine_running", 0.0))) for s in timeline)
    area, _ = held_integral(points, 0.0, end_s)
    return area / (end_s * slots) if end_s > 0 and slots > 0 else 0.0


def measured_figures(run_dir: str | Path, scenario: Scenario) -> Figures:
    """The figures of a finished real run (module docstring); ``scenario`` is its ``from_run``
    scenario, which fixes the warm-up rule and the slot count."""
    run = Path(run_dir)
    metrics = read_jsonl(run / "metrics.jsonl")
    if not metrics:
        raise ValueError(f"{run}: no training step in metrics.jsonl")
    ledger = read_jsonl(run / "trajectories.jsonl")
    timeline = read_jsonl(run / "timeline.jsonl")
    window = warmup_s({"metrics": metrics}, scenario)
    throughput = measure_throughput(metrics, ledger, timeline, warmup_s=window).steady_state_tokens_per_s
    hist: Counter[int] = Counter()
    for m in metrics:
        hist.update({int(k): int(v) for k, v in (m.get("staleness_hist") or {}).items()})
    groups = sum(hist.values())
    staleness = sum(k * v for k, v in hist.items()) / groups if groups else 0.0
    end = float(metrics[-1]["time_s"])
    occupancy = _occupancy(timeline, end, scenario.slots * scenario.engines)
    return Figures(throughput, staleness, occupancy)


def predicted_figures(scenario: Scenario, profile: CostProfile, seeds: Sequence[int]) -> Figures:
    """The simulator's figures for ``scenario`` under ``profile``, each the mean over ``seeds``."""
    results = [simulate(replace(scenario, seed=seed), profile).result for seed in seeds]
    return Figures(
        statistics.fmean(r.steady_state_tokens_per_s for r in results),
        statistics.fmean(r.staleness_mean for r in results),
        statistics.fmean(r.engine_occupancy for r in results),
    )


def _setting(run_dir: Path) -> dict[str, Any]:
    """What distinguishes the run: η, the interrupt mode, the mark, the batch, the task."""
    cfg = load_config(run_dir / "config.yaml")
    c, r = cfg.controller, cfg.rollout
    return {
        "task": cfg.task.name,
        "max_staleness": c.max_staleness,
        "interrupt_mode": r.interrupt_mode,
        "high_water_batches": c.high_water_batches,
        "batch_size": c.batch_size,
        "group_size": r.group_size,
        "max_new_tokens": r.max_new_tokens,
        "steps": c.total_steps,
    }


def _error(predicted: float, measured: float) -> float | None:
    """Relative error; 0 when both are 0 (η = 0's staleness), None when only the measurement is."""
    if measured:
        return (predicted - measured) / measured
    return 0.0 if predicted == 0 else None


def validate_runs(
    runs: Sequence[str | Path],
    profile: CostProfile,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    tolerance: float = 0.15,
    calibration_runs: Sequence[str | Path] = (),
) -> dict[str, Any]:
    """Predicted against measured for every run: rows (setting, both figures, relative errors, pass),
    the worst error per figure, and the share of runs within ``tolerance`` on every figure."""
    calibration = {Path(r).resolve() for r in calibration_runs}
    shared = [str(r) for r in runs if Path(r).resolve() in calibration]
    if shared:
        raise ValueError(f"a run cannot both calibrate the profile and validate it: {shared}")
    rows = []
    for run in runs:
        run_dir = Path(run)
        scenario = from_run(run_dir, profile=profile.name)
        measured = measured_figures(run_dir, scenario)
        predicted = predicted_figures(scenario, profile, seeds)
        errors = {f: _error(getattr(predicted, f), getattr(measured, f)) for f in FIGURES}
        rows.append(
            {
                "run_dir": str(run_dir),
                **_setting(run_dir),
                "measured": vars(measured),
                "predicted": vars(predicted),
                "error": errors,
                "within": all(e is not None and abs(e) <= tolerance for e in errors.values()),
            }
        )
    worst = {}
    for figure in FIGURES:
        candidates = [(abs(r["error"][figure]), r) for r in rows if r["error"][figure] is not None]
        if candidates:
            size, row = max(candidates, key=lambda c: c[0])
            worst[figure] = {"abs_error": size, "run_dir": row["run_dir"]}
    return {
        "bench": "sim-validate",
        "profile": profile.name,
        "seeds": list(seeds),
        "tolerance": tolerance,
        "calibration_runs": [str(r) for r in calibration_runs],
        "rows": rows,
        "worst": worst,
        "runs_within": sum(r["within"] for r in rows),
        "runs": len(rows),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--runs`` (required), ``--profile`` or ``--from-runs``, ``--seeds``, ``--json``."""
    add_json(parser, "write the predictions, measurements and errors here")
    parser.add_argument("--runs", help="comma-separated measured run directories to predict")
    parser.add_argument("--profile", help="a cost profile name or file (default: this machine's)")
    parser.add_argument("--from-runs", help="comma-separated run directories to refine the profile from (not --runs)")
    add_seeds(parser, "0,1,2", "simulator seeds")


def run(args: argparse.Namespace) -> None:
    """Predict each run of ``--runs``, print predicted / measured (error) per figure, write ``--json``."""
    from asyncrl.sim.calibrate import machine_profile
    from asyncrl.sim.profile import load_profile

    targets = [r for r in (args.runs or "").split(",") if r]
    calibration = [r for r in (args.from_runs or "").split(",") if r]
    if not targets:
        raise ConfigError("--runs DIR[,DIR...] names the measured runs to predict")
    if args.profile and calibration:
        raise ConfigError("give --profile or --from-runs (a profile refined from runs), not both")
    seeds = parse_list(args.seeds, int, (0, 1, 2), "--seeds")
    try:
        cost = load_profile(args.profile) if args.profile else machine_profile(runs=calibration)
        out = validate_runs(targets, cost, seeds=seeds, calibration_runs=calibration)
    except (ValueError, KeyError, FileNotFoundError) as exc:
        raise ConfigError(str(exc)) from exc
    print(f"profile {out['profile']}, simulator seeds {out['seeds']}: predicted / measured (error)")
    for row in out["rows"]:
        cells = [
            f"{f} {row['predicted'][f]:,.3g} / {row['measured'][f]:,.3g} "
            f"({'n/a' if row['error'][f] is None else format(row['error'][f], '+.1%')})"
            for f in FIGURES
        ]
        setting = f"eta={row['max_staleness']} {row['interrupt_mode']} task={row['task']}"
        print(f"  {Path(row['run_dir']).name:<24} {setting:<28} " + "; ".join(cells) + ("" if row["within"] else "  X"))
    print(f"{out['runs_within']}/{out['runs']} runs within {out['tolerance']:.0%} on every figure")
    if args.json:
        written = write_text_result(args.json, json.dumps(out, indent=2) + "\n")  # never over a file
        print(f"written to {written}")
