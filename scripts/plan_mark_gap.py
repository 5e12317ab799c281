"""Why ``asyncrl plan`` saw a high-water mark of 1 as free on ``task``: the checks of
docs/results/record/simulator-log.md §9.

``python scripts/plan_mark_gap.py --profile PROFILE.json --runs RUN,... --calibration CAL --json OUT``
simulates every measured run from its own config and ledger (``from_run``, as ``bench sim-validate``
does) under the profile and writes, grouped by setting (η, mark, interrupt mode):

- **where each step's time goes**, measured and simulated (seed 0): the sums over the steps after the
  first ``SKIP_STEPS`` of the trainer's wait for a batch, its training, its weight sync and the rest of
  the step's wall time (controller bookkeeping, which the simulator does not charge), and the trainer's
  seconds per trained token;
- **the mark on the same ledger**: each run simulated at marks 1 and 2 with its η and mode (seeds 0-2),
  so the model's own mark-1 / mark-2 ratio can be read beside the measured one;
- **the engine's speed**: measured over simulated decode seconds (seed 0), and the predicted throughput
  with the profile's decode costs x ``DECODE_SCALES`` and with each run's own engine and trainer speed
  (decode costs x that run's measured / simulated decode seconds, the trainer's per-token cost x its
  measured / simulated training seconds): a diagnosis, not a prediction (it reads the run it predicts);
- **milliseconds per decode step by the engine's mean running samples** in each step's window, measured
  (decode steps from the metrics' ``engine_slot_occupancy``, as ``scripts/sim_diagnose.py``) and
  simulated with the same formula from the simulated metrics, for each setting and the calibration run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from asyncrl.controller.rundir import read_jsonl
from asyncrl.sim.calibrate import scale_decode
from asyncrl.sim.profile import CostProfile, load_profile
from asyncrl.sim.run import simulate
from asyncrl.sim.scenario import Scenario, from_run

SKIP_STEPS = 4
"""Steps left out of the time sums (the pipeline filling)."""
SEEDS = (0, 1, 2)
DECODE_SCALES = (1.0, 1.1, 1.2, 1.3)
RUNNING_BINS = (0, 20, 30, 40, 50, 60, 80, 129)
"""Edges of the mean-running-samples bins of the per-step-window decode cost."""


def step_budget(metrics: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Sums over the steps after ``SKIP_STEPS``: wall, wait for a batch, training, weight sync, the rest."""
    rows = metrics[SKIP_STEPS:]
    sums = {
        k: sum(float(m.get(k) or 0.0) for m in rows)
        for k in ("step_wall_s", "wait_for_batch_s", "train_step_s", "weight_sync_s")
    }
    sums["other_s"] = sums["step_wall_s"] - sums["wait_for_batch_s"] - sums["train_step_s"] - sums["weight_sync_s"]
    sums["trained_tokens"] = sum(int(m["trained_tokens"]) for m in rows)
    sums["train_s_per_token"] = sums["train_step_s"] / sums["trained_tokens"] if sums["trained_tokens"] else 0.0
    sums["steps_waiting"] = sum(1 for m in rows if float(m.get("wait_for_batch_s") or 0.0) > 0.005)
    sums["steps"] = len(rows)
    return sums


def decode_windows(metrics: Sequence[dict[str, Any]], slots: int) -> list[tuple[float, float, float]]:
    """Per step window: ``(mean running samples while decoding, decode steps, engine busy seconds)``."""
    out = []
    for m in metrics:
        occupancy = m.get("engine_slot_occupancy")
        if not occupancy:
            continue
        generated = float(m["generated_tokens_per_s"]) * float(m["step_wall_s"])
        samples = float(m.get("rollout_samples") or 0.0) * (1 + float(m.get("interruptions_per_sample") or 0.0))
        steps = (generated - samples) / (slots * occupancy)
        out.append((slots * occupancy, steps, float(m["engine_busy_frac"]) * float(m["step_wall_s"])))
    return out


def ms_per_step_by_running(windows: Sequence[tuple[float, float, float]]) -> dict[str, dict[str, float]]:
    """Engine busy milliseconds per decode step, pooled over the windows of each running-samples bin."""
    pooled: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for running, steps, busy in windows:
        b = max(i for i, edge in enumerate(RUNNING_BINS[:-1]) if edge <= running)
        pooled[b][0] += steps
        pooled[b][1] += busy
    return {
        f"{RUNNING_BINS[b]}-{RUNNING_BINS[b + 1]}": {"ms_per_step": 1e3 * busy / steps, "decode_steps": steps}
        for b, (steps, busy) in sorted(pooled.items())
        if steps > 0
    }


def throughput(scenario: Scenario, profile: CostProfile, seeds: Sequence[int] = SEEDS) -> float:
    """Predicted steady-state throughput, the mean over ``seeds``."""
    return statistics.fmean(
        simulate(replace(scenario, seed=s), profile).result.steady_state_tokens_per_s for s in seeds
    )


def own_speed(profile: CostProfile, decode_ratio: float, train_ratio: float) -> CostProfile:
    """``profile`` with the decode costs and the trainer's per-token cost scaled to one run's measured speed."""
    trainer = replace(profile.trainer, per_token_s=profile.trainer.per_token_s * train_ratio)
    return replace(profile, engine=scale_decode(profile.engine, decode_ratio), trainer=trainer)


def run_row(run: Path, profile: CostProfile) -> dict[str, Any]:
    """Every check of the module docstring for one measured run."""
    from benchmarks.sim_validate import measured_figures

    scenario = from_run(run, profile=profile.name)
    metrics = read_jsonl(run / "metrics.jsonl")
    timeline = read_jsonl(run / "timeline.jsonl")
    sim = simulate(replace(scenario, seed=0), profile)
    measured, simulated = step_budget(metrics), step_budget(sim.raw["metrics"])
    decode_ratio = (timeline[-1]["engine_decode_s"] - timeline[0]["engine_decode_s"]) / sim.raw["engine"]["decode_s"]
    train_ratio = measured["train_s_per_token"] / simulated["train_s_per_token"]
    slots = scenario.slots * scenario.engines
    return {
        "run_dir": str(run),
        "setting": {
            "max_staleness": scenario.max_staleness,
            "high_water_batches": scenario.high_water_batches,
            "interrupt_mode": scenario.interrupt_mode,
        },
        "throughput_measured": measured_figures(run, scenario).throughput,
        "throughput_predicted": throughput(scenario, profile),
        "step_time_measured": measured,
        "step_time_simulated_seed0": simulated,
        "predicted_at_mark": {str(k): throughput(replace(scenario, high_water_batches=k), profile) for k in (1, 2)},
        "decode_s_measured_over_simulated": decode_ratio,
        "train_s_per_token_measured_over_simulated": train_ratio,
        "predicted_at_decode_scale": {
            str(f): throughput(scenario, replace(profile, engine=scale_decode(profile.engine, f)))
            for f in DECODE_SCALES
        },
        "predicted_at_own_speed": throughput(scenario, own_speed(profile, decode_ratio, train_ratio)),
        "windows_measured": decode_windows(metrics, slots),
        "windows_simulated_seed0": decode_windows(sim.raw["metrics"], slots),
    }


def setting_label(row: dict[str, Any]) -> str:
    s = row["setting"]
    return f"eta{s['max_staleness']} hw{s['high_water_batches']} {s['interrupt_mode']}"


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per setting: means over its runs of the throughputs and ratios, summed step times, pooled windows."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by[setting_label(row)].append(row)
    out = {}
    for label, group in by.items():

        def mean(key: str, g: list[dict[str, Any]] = group) -> float:
            return statistics.fmean(r[key] for r in g)

        def summed(key: str, g: list[dict[str, Any]] = group) -> dict[str, float]:
            sums = {k: sum(r[key][k] for r in g) for k in g[0][key]}
            sums["train_s_per_token"] = sums["train_step_s"] / sums["trained_tokens"]
            return sums

        def pooled(key: str, g: list[dict[str, Any]] = group) -> dict[str, dict[str, float]]:
            return ms_per_step_by_running([w for r in g for w in r[key]])

        out[label] = {
            "runs": len(group),
            "throughput_measured": mean("throughput_measured"),
            "throughput_predicted": mean("throughput_predicted"),
            "predicted_at_mark": {k: statistics.fmean(r["predicted_at_mark"][k] for r in group) for k in ("1", "2")},
            "predicted_at_own_speed": mean("predicted_at_own_speed"),
            "predicted_at_decode_scale": {
                str(f): statistics.fmean(r["predicted_at_decode_scale"][str(f)] for r in group) for f in DECODE_SCALES
            },
            "decode_s_measured_over_simulated": mean("decode_s_measured_over_simulated"),
            "train_s_per_token_measured_over_simulated": mean("train_s_per_token_measured_over_simulated"),
            "step_time_measured": summed("step_time_measured"),
            "step_time_simulated_seed0": summed("step_time_simulated_seed0"),
            "ms_per_step_by_running_measured": pooled("windows_measured"),
            "ms_per_step_by_running_simulated": pooled("windows_simulated_seed0"),
        }
    return out


def calibration_windows(run: Path, profile: CostProfile) -> dict[str, Any]:
    """The per-bin decode cost of the calibration run, measured and simulated (seed 0)."""
    scenario = from_run(run, profile=profile.name)
    sim = simulate(replace(scenario, seed=0), profile)
    slots = scenario.slots * scenario.engines
    measured = decode_windows(read_jsonl(run / "metrics.jsonl"), slots)
    return {
        "run_dir": str(run),
        "ms_per_step_by_running_measured": ms_per_step_by_running(measured),
        "ms_per_step_by_running_simulated": ms_per_step_by_running(decode_windows(sim.raw["metrics"], slots)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, help="cost profile (a shipped name or a JSON file)")
    parser.add_argument("--runs", required=True, help="comma-separated measured runs")
    parser.add_argument("--calibration", default="", help="the profile's calibration run (per-bin decode cost only)")
    parser.add_argument("--json", required=True, help="where to write the result")
    args = parser.parse_args()
    profile = load_profile(args.profile)
    rows = [run_row(Path(r), profile) for r in args.runs.split(",")]
    out: dict[str, Any] = {
        "command": "python scripts/plan_mark_gap.py --profile PROFILE --runs RUN,... --calibration CAL --json OUT",
        "profile": args.profile,
        "seeds": list(SEEDS),
        "skip_steps": SKIP_STEPS,
        "settings": summarise(rows),
        "calibration": calibration_windows(Path(args.calibration), profile) if args.calibration else None,
        "runs": [{k: v for k, v in r.items() if not k.startswith("windows_")} for r in rows],
    }
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    for label, s in out["settings"].items():
        m, p = s["step_time_measured"], s["step_time_simulated_seed0"]
        print(
            f"{label:16s} measured {s['throughput_measured']:6.0f} predicted {s['throughput_predicted']:6.0f} "
            f"(mark 1 {s['predicted_at_mark']['1']:6.0f}, mark 2 {s['predicted_at_mark']['2']:6.0f}; own speed "
            f"{s['predicted_at_own_speed']:6.0f}); wait {m['wait_for_batch_s']:5.2f} / {p['wait_for_batch_s']:5.2f} s, "
            f"decode x{s['decode_s_measured_over_simulated']:.3f}, "
            f"train x{s['train_s_per_token_measured_over_simulated']:.3f}"
        )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks/ beside src/
    main()
