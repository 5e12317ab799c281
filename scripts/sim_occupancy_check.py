"""Is an engine-occupancy miss the model or the measurement? The checks behind
docs/results/record/simulator-log.md §5.1's note on `task` η = 2 (abort).

``python scripts/sim_occupancy_check.py --from-runs CAL --runs RUN,... --json OUT`` refines this
machine's profile from ``CAL`` (as ``python -m benchmarks sim-validate --from-runs`` does) and, for every run,
reads its own files (``timeline.jsonl``, ``metrics.jsonl``, ``trajectories.jsonl``) and simulates it
(``from_run``, seed 0 unless said) to write:

- ``measured``: the occupancy as ``sim-validate`` reads it (0.25 s ``engine_running`` snapshots, held);
  the samples **in transit** (the controller counts them generating, the engine neither runs nor queues
  them: finished samples not yet reported, and aborted ones not yet resubmitted: the abort round trip),
  as a share of the slots; the **admission lag** (snapshots with free slots while requests wait, as a
  share of the slots: between the waiting requests and all the free slots, since a waiting request
  holds 1 to G samples); interruptions per second;
- ``interruptions``: samples aborted (or, under ``keep``, interrupted) over the run, measured (the
  ledger's ``num_interruptions``, every sample) and simulated (seed 0): each counts a sample running
  at a weight update, so with the same number of updates they compare the samples in flight at the
  updates exactly, snapshots aside;
- ``window_estimate``: the same counter estimate on both sides, per ``metrics.jsonl`` step window
  (decode seconds x the window's mean decode rows, from ``engine_slot_occupancy``), measured and
  simulated: the running samples while decoding, without the prefill and update pauses and without
  the snapshots;
- ``simulated``: the exact occupancy (the time integral), the same read from 0.25 s snapshots at eight
  phases of the sampling grid, beside that simulation's exact figure (how much the measurement method
  alone moves the figure), the figure
  with groups drawn instead of replayed in order over ``--draw-seeds`` seeds (mean, standard deviation,
  range), and the figure with the abort round trip modelled: aborted samples out of the engine, the
  engine idle, for ``d`` seconds before their re-prefill when nothing else waits (the simulator
  otherwise keeps them in their slots; ``d`` spans the round trip the transit share allows).

The round-trip variant wraps ``SimEngine._abort`` for the duration of one simulation (a diagnostic
variant, not a model option: it did not move the figure it was meant to explain, §5.1).
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from asyncrl.controller.rundir import read_jsonl
from asyncrl.sim import engine as sim_engine
from asyncrl.sim.calibrate import machine_profile
from asyncrl.sim.profile import CostProfile
from asyncrl.sim.run import simulate
from asyncrl.sim.scenario import Scenario, from_run

SNAPSHOT_S = 0.25
"""The real controller's timeline period (``Controller._sample_timeline``)."""
PHASES = 8
ROUND_TRIPS_S = (0.01, 0.03, 0.06)


def _interp(timeline: Sequence[dict[str, Any]], times: Sequence[float], key: str, t: float) -> float:
    """A cumulative counter of the timeline at time ``t`` (linear between samples)."""
    i = bisect.bisect_left(times, t)
    if i <= 0:
        return float(timeline[0][key])
    if i >= len(times):
        return float(timeline[-1][key])
    a, b = timeline[i - 1], timeline[i]
    frac = (t - a["t"]) / (b["t"] - a["t"]) if b["t"] > a["t"] else 0.0
    return float(a[key] + frac * (b[key] - a[key]))


def window_estimate(metrics: Sequence[dict[str, Any]], timeline: Sequence[dict[str, Any]], slots: int) -> float:
    """Running samples while decoding over slots x run time, per step window: the window's decode
    seconds (the timeline's counter) x its mean decode rows (``engine_slot_occupancy`` x slots)."""
    times = [float(x["t"]) for x in timeline]
    area = 0.0
    for m in metrics:
        occupancy = m.get("engine_slot_occupancy")
        if not occupancy:
            continue
        end = float(m["time_s"])
        start = end - float(m["step_wall_s"])
        decode_s = _interp(timeline, times, "engine_decode_s", end) - _interp(timeline, times, "engine_decode_s", start)
        area += decode_s * occupancy * slots
    run_s = float(metrics[-1]["time_s"])
    return area / (slots * run_s) if run_s > 0 else 0.0


def interruptions(ledger: Sequence[dict[str, Any]]) -> int:
    """Interruptions over every sample of a ledger (``trajectories.jsonl`` rows, real or simulated)."""
    return sum(r.get("num_interruptions") or 0 for r in ledger if r.get("sample_idx") is not None)


def handoff(run: Path, slots: int) -> dict[str, float]:
    """Samples in transit and the admission lag of a real run, as shares of the slots (module docstring)."""
    metrics = read_jsonl(run / "metrics.jsonl")
    end = float(metrics[-1]["time_s"])
    timeline = [x for x in read_jsonl(run / "timeline.jsonl") if x["t"] <= end]
    n = len(timeline)
    transit = sum(max(0.0, x["generating_samples"] - x["engine_running"]) for x in timeline if not x["engine_waiting"])
    lagged = [x for x in timeline if x["engine_waiting"] and x["engine_running"] < slots]
    low = sum(min(slots - x["engine_running"], x["engine_waiting"]) for x in lagged)
    high = sum(slots - x["engine_running"] for x in lagged)
    ledger = read_jsonl(run / "trajectories.jsonl")
    aborts = interruptions(ledger)
    return {
        "transit_share": transit / (n * slots),
        "admission_lag_share": [low / (n * slots), high / (n * slots)],
        "interruptions_per_s": aborts / end,
        "snapshots": n,
    }


@contextmanager
def abort_round_trip(seconds: float) -> Iterator[None]:
    """Aborted samples spend ``seconds`` out of the engine (idle, not running) before their re-prefill
    when nothing else waits: ``SimEngine._abort`` wrapped for the duration."""
    original = sim_engine.SimEngine._abort

    def away_then_back(self: sim_engine.SimEngine) -> None:
        if self.run and not self.waiting:
            self.t += seconds
        original(self)

    sim_engine.SimEngine._abort = away_then_back  # type: ignore[method-assign]
    try:
        yield
    finally:
        sim_engine.SimEngine._abort = original  # type: ignore[method-assign]


def snapshot_phases(scenario: Scenario, profile: CostProfile) -> tuple[float, list[float]]:
    """The simulated occupancy read as ``sim-validate`` reads a real run's, from 0.25 s snapshots held
    until the next, at ``PHASES`` offsets of the sampling grid; with the exact figure of the same
    simulation (a finer timeline syncs the engines more often, which moves a run by under 1%)."""
    fine = replace(scenario, timeline_period_s=SNAPSHOT_S / PHASES, timeline_lines=1_000_000)
    sim = simulate(fine, profile)
    end, slots = sim.raw["end_s"], scenario.slots * scenario.engines
    timeline = [x for x in sim.raw["timeline"] if x["t"] <= end]
    out = []
    for phase in range(PHASES):
        points = timeline[phase::PHASES]
        ends = [*points[1:], {"t": end}]
        area = sum(p["engine_running"] * (min(q["t"], end) - p["t"]) for p, q in zip(points, ends, strict=True))
        out.append(area / ((end - points[0]["t"]) * slots))
    return sim.result.engine_occupancy, out


def check(run: Path, profile: CostProfile, draw_seeds: Sequence[int]) -> dict[str, Any]:
    from benchmarks.sim_validate import measured_figures

    scenario = from_run(run, profile=profile.name)
    slots = scenario.slots * scenario.engines
    measured = measured_figures(run, scenario)
    sim = simulate(scenario, profile)
    drawn = [
        simulate(replace(scenario, ledger_ordered=False, seed=s), profile).result.engine_occupancy for s in draw_seeds
    ]
    round_trip = {}
    if scenario.interrupt_mode == "abort":
        for seconds in ROUND_TRIPS_S:
            with abort_round_trip(seconds):
                round_trip[str(seconds)] = simulate(scenario, profile).result.engine_occupancy
    exact, phases = snapshot_phases(scenario, profile)
    return {
        "run_dir": str(run),
        "max_staleness": scenario.max_staleness,
        "interrupt_mode": scenario.interrupt_mode,
        "high_water_batches": scenario.high_water_batches,
        "measured": {"occupancy": measured.engine_occupancy, **handoff(run, slots)},
        "interruptions": {
            "measured": interruptions(read_jsonl(run / "trajectories.jsonl")),
            "simulated": interruptions(sim.raw["ledger"] or []),
            "steps": scenario.total_steps,
        },
        "window_estimate": {
            "measured": window_estimate(read_jsonl(run / "metrics.jsonl"), read_jsonl(run / "timeline.jsonl"), slots),
            "simulated": window_estimate(sim.raw["metrics"], sim.raw["timeline"], slots),
        },
        "simulated": {
            "occupancy": sim.result.engine_occupancy,
            "snapshot_phases": [min(phases), max(phases)],
            "snapshot_run_exact": exact,
            "drawn": {
                "seeds": list(draw_seeds),
                "mean": statistics.fmean(drawn),
                "stdev": statistics.stdev(drawn),
                "range": [min(drawn), max(drawn)],
            },
            "abort_round_trip_s": round_trip,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from-runs", required=True, help="comma-separated calibration runs")
    parser.add_argument("--runs", required=True, help="comma-separated measured runs")
    parser.add_argument("--draw-seeds", type=int, default=10, help="seeds of the drawn-order spread")
    parser.add_argument("--json", required=True, help="where to write the result")
    args = parser.parse_args()
    calibration = args.from_runs.split(",")
    profile = machine_profile(runs=calibration)
    rows = []
    for run in args.runs.split(","):
        row = check(Path(run), profile, range(args.draw_seeds))
        rows.append(row)
        m, s, w = row["measured"], row["simulated"], row["window_estimate"]
        print(
            f"{Path(run).name:18s} occupancy measured {m['occupancy']:.3f} simulated {s['occupancy']:.3f} "
            f"(snapshots {s['snapshot_phases'][0]:.3f}-{s['snapshot_phases'][1]:.3f}; drawn {s['drawn']['mean']:.3f} "
            f"± {s['drawn']['stdev']:.3f}); window estimate {w['measured']:.3f} / {w['simulated']:.3f}; "
            f"transit {m['transit_share']:.3f}; interruptions {row['interruptions']['measured']} / "
            f"{row['interruptions']['simulated']}; round trip {s['abort_round_trip_s']}"
        )
    out = {
        "calibration_runs": calibration,
        "decode_scale": profile.extra.get("decode_scale"),
        "rows": rows,
        "command": "python scripts/sim_occupancy_check.py --from-runs CAL --runs RUN,... --json OUT",
    }
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks/ beside src/
    main()
