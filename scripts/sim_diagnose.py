"""Why the simulator misses a measured run: the checks behind docs/results/record/simulator-log.md §5.1's explanations.

``python scripts/sim_diagnose.py --from-runs CAL --runs RUN,... --json OUT`` refines this machine's
profile from ``CAL`` (as ``python -m benchmarks sim-validate --from-runs`` does) and, for every run, writes:

- the engine's work: decode steps and milliseconds per decode step, measured (steps from the
  metrics' ``engine_slot_occupancy`` = decode tokens / (slots x steps)) and simulated (seed 0) with
  the slot layout (the profile) and packed (``slot_prefix_rows`` off, same costs), and the measured
  over simulated decode seconds: how much slower (> 1) or faster this run's engine was than the
  calibration run's;
- trained tokens per step, measured and simulated with the ledger's filter verdicts and with a coin
  at the same rate (``ledger_filter`` off);
- the predicted figures with the decode costs x 0.9, 0.95, 1.05, 1.1 (how sensitive each is to the
  engine's speed) and, with groups drawn instead of replayed in order, their range over seeds 0-5.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from asyncrl.controller.rundir import read_jsonl
from asyncrl.sim.calibrate import machine_profile, scale_decode
from asyncrl.sim.profile import CostProfile
from asyncrl.sim.run import simulate
from asyncrl.sim.scenario import Scenario, from_run

SCALES = (0.9, 0.95, 1.05, 1.1)
DRAW_SEEDS = range(6)


def measured_engine(run: Path) -> dict[str, float]:
    """Decode seconds and steps, and trained tokens per step, of a real run."""
    metrics = read_jsonl(run / "metrics.jsonl")
    timeline = read_jsonl(run / "timeline.jsonl")
    steps = 0.0
    for m in metrics:
        occupancy = m.get("engine_slot_occupancy")
        if occupancy:
            generated = m["generated_tokens_per_s"] * m["step_wall_s"]
            decoded = generated - m.get("rollout_samples", 0) * (1 + (m.get("interruptions_per_sample") or 0))
            steps += decoded / (128 * occupancy)
    decode_s = timeline[-1]["engine_decode_s"] - timeline[0]["engine_decode_s"]
    trained = statistics.fmean(m["trained_tokens"] for m in metrics)
    return {
        "decode_s": decode_s,
        "decode_steps": steps,
        "ms_per_step": 1e3 * decode_s / steps,
        "trained_tokens_per_step": trained,
    }


def simulated_engine(scenario: Scenario, profile: CostProfile) -> dict[str, float]:
    raw = simulate(scenario, profile).raw
    eng, steps = raw["engine"], raw["engine"]["decode_steps"]
    return {
        "decode_s": eng["decode_s"],
        "decode_steps": steps,
        "ms_per_step": 1e3 * eng["decode_s"] / steps,
        "trained_tokens_per_step": raw["trained_tokens"] / scenario.total_steps,
    }


def figures(scenario: Scenario, profile: CostProfile) -> dict[str, float]:
    r = simulate(scenario, profile).result
    return {
        "throughput": r.steady_state_tokens_per_s,
        "staleness_mean": r.staleness_mean,
        "engine_occupancy": r.engine_occupancy,
    }


def diagnose(run: Path, profile: CostProfile) -> dict[str, Any]:
    scenario = from_run(run, profile=profile.name)
    packed = replace(profile, engine=replace(profile.engine, slot_prefix_rows=False))
    measured = measured_engine(run)
    layout = simulated_engine(scenario, profile)
    coin = simulated_engine(replace(scenario, ledger_filter=False), profile)
    drawn = [figures(replace(scenario, ledger_ordered=False, seed=s), profile) for s in DRAW_SEEDS]
    return {
        "run_dir": str(run),
        "measured": measured,
        "simulated_layout": layout,
        "simulated_packed": simulated_engine(scenario, packed),
        "decode_s_measured_over_simulated": measured["decode_s"] / layout["decode_s"],
        "trained_tokens_per_step_coin_filter": coin["trained_tokens_per_step"],
        "figures_at_decode_scale": {
            str(f): figures(scenario, replace(profile, engine=scale_decode(profile.engine, f))) for f in SCALES
        },
        "figures_drawn_over_seeds": {k: [min(d[k] for d in drawn), max(d[k] for d in drawn)] for k in drawn[0]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from-runs", required=True, help="comma-separated calibration runs")
    parser.add_argument("--runs", required=True, help="comma-separated measured runs to diagnose")
    parser.add_argument("--json", required=True, help="where to write the result")
    args = parser.parse_args()
    calibration = args.from_runs.split(",")
    profile = machine_profile(runs=calibration)
    rows = [diagnose(Path(r), profile) for r in args.runs.split(",")]
    out = {
        "calibration_runs": calibration,
        "decode_scale": profile.extra.get("decode_scale"),
        "rows": rows,
        "command": "python scripts/sim_diagnose.py --from-runs CAL --runs RUN,... --json OUT",
    }
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    for row in rows:
        m, s, p = row["measured"], row["simulated_layout"], row["simulated_packed"]
        print(
            f"{Path(row['run_dir']).name:18s} steps {m['decode_steps']:6.0f} / {s['decode_steps']:6.0f} layout / "
            f"{p['decode_steps']:6.0f} packed; ms/step {m['ms_per_step']:5.2f} / {s['ms_per_step']:5.2f} / "
            f"{p['ms_per_step']:5.2f}; decode s measured/simulated {row['decode_s_measured_over_simulated']:.3f}"
        )


if __name__ == "__main__":
    main()
