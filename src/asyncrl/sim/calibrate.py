"""``python -m benchmarks profile``: the cost profile of this machine, from measurements.

Owns the fits that turn measurements into a ``CostProfile``:

- decode: ``bench decode``'s rows (one batch of N sequences of context C decoding T tokens each)
  fitted by least squares on relative error to ``steps x (base + per_seq x N + per_ctx x N x C_mean)``
  with ``C_mean = C + (T + 1) / 2``;
- trainer: the synchronous (``max_staleness = 0``) rows of the committed ``bench async`` and
  ``bench headline`` results (mean step time against trained tokens per step; the trainer runs
  alone there) fitted to ``base + per_token x tokens``;
- weight sync: the same rows' ``weight_sync_s`` (median), split into the engine's own load time
  (``time_budget.engine_update_s`` per step, where recorded) and the trainer's export;
- prefill and reward latency: from real run directories when given (``--from-runs``: the timeline's
  prefill seconds per prefill token, the metrics' reward latency), else stated assumptions;
- the engine inside a training run: with ``--from-runs``, the step cost is that of
  ``LocalEngine``'s slot layout (``EngineCost.slot_prefix_rows``, ``sim.layout``: the sweep's N
  identical samples fill slots ``[0, N)`` with one context; a training run's samples end at
  different steps and leave idle rows, and attention pads to the longest rows), and the fit is
  scaled so that the simulation of each run (``sim.scenario.from_run``: its config, its own
  prompts in its own order) decodes for as long as the run's engine did: ``decode_scale``, a fixed
  point of measured / simulated decode seconds (the engine shares its process with the
  controller, which the sweep does not).

With at least ``MIN_RUN_POINTS`` per-step records, the trainer fit is the runs' own (their
``train_step_s`` against ``trained_tokens``) and not the committed rows': the cost of a trained
token depends on the sequence lengths (attention, packing), so a profile refined by runs describes
their workload (measured: 1.47e-4 s per token on workload ``task`` against 2.2e-4 on ``long``).
Every number names its source in the profile.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from asyncrl.sim.profile import CostProfile, EngineCost, RewardCost, Source, SyncCost, TrainerCost

DECODE_FILE = "bench_decode_long_policy.json"
REPO_RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results"
"""The committed results of a source checkout (``docs/results`` of the working directory otherwise)."""
TRAINER_FILES = ("bench_async_*.json", "bench_headline_reason.json")
MIN_RUN_POINTS = 5
"""Per-step trainer records from ``--from-runs`` needed to fit the trainer from the runs alone."""


def fit_decode(rows: Sequence[dict[str, Any]]) -> tuple[float, float, float, float]:
    """``(base_s, per_seq_s, per_ctx_token_s, worst relative error)`` of ``bench decode`` rows."""
    design, target = [], []
    for r in rows:
        n, steps = r["running"], r["decode_tokens"] / r["running"]
        ctx = r["context"] + (r["new_tokens"] + 1) / 2
        design.append([steps, steps * n, steps * n * ctx])
        target.append(r["decode_s"])
    x, y = np.asarray(design), np.asarray(target)
    w = 1.0 / y  # relative error
    coef, *_ = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)
    coef = np.clip(coef, 0.0, None)
    worst = float(np.max(np.abs(x @ coef - y) / y))
    return float(coef[0]), float(coef[1]), float(coef[2]), worst


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(intercept, slope)`` of a least-squares line through ``(x, y)`` points (intercept >= 0)."""
    x = np.asarray([p[0] for p in points], dtype=np.float64)
    y = np.asarray([p[1] for p in points], dtype=np.float64)
    slope, intercept = np.polyfit(x, y, 1)
    if intercept < 0:  # through the origin instead
        return 0.0, float((x @ y) / (x @ x))
    return float(intercept), float(slope)


def trainer_rows(results: Path) -> list[dict[str, Any]]:
    """Synchronous rows with a mean step time and trained tokens, from the committed results."""
    rows = []
    for pattern in TRAINER_FILES:
        for path in sorted(results.glob(pattern)):
            for r in json.loads(path.read_text()).get("rows", []):
                if r.get("max_staleness") == 0 and r.get("steps") and r.get("train_step_s"):
                    rows.append({**r, "_file": path.name})
    return rows


def decode_scale(profile: CostProfile, runs: Sequence[str | Path], measured_s: float, iterations: int = 4) -> float:
    """The factor on ``profile``'s decode costs with which the simulations of ``runs`` (seed 0)
    decode for ``measured_s`` seconds in all (the runs' engines' own decode seconds): ``iterations``
    fixed-point steps of measured / simulated (the schedule, and so the simulated seconds, moves
    a little with the scale)."""
    from asyncrl.sim.run import simulate
    from asyncrl.sim.scenario import from_run

    scenarios = [from_run(run, profile=profile.name) for run in runs]
    scale = 1.0
    for _ in range(iterations):
        scaled = replace(profile, engine=scale_decode(profile.engine, scale))
        simulated = sum(simulate(sc, scaled).raw["engine"]["decode_s"] for sc in scenarios)
        if simulated <= 0:
            break
        scale *= measured_s / simulated
    return scale


def scale_decode(engine: EngineCost, scale: float) -> EngineCost:
    """``engine`` with its three decode costs multiplied by ``scale``."""
    return replace(
        engine,
        decode_base_s=engine.decode_base_s * scale,
        decode_per_seq_s=engine.decode_per_seq_s * scale,
        decode_per_ctx_token_s=engine.decode_per_ctx_token_s * scale,
    )


def _run_measurements(runs: Sequence[str | Path]) -> dict[str, Any]:
    """Per-step trainer points, sync times, reward latency, prefill cost and decode seconds of real
    run directories."""
    points, sync, reward, decode_s, prefill_s, prefill_tokens = [], [], [], 0.0, 0.0, 0.0
    for run in map(Path, runs):
        metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
        points += [(m["trained_tokens"], m["train_step_s"]) for m in metrics if m.get("train_step_s")]
        sync += [m["weight_sync_s"] for m in metrics if m.get("weight_sync_s") is not None]
        reward += [m["reward_latency_p50_s"] for m in metrics if m.get("reward_latency_p50_s") is not None]
        timeline = [json.loads(x) for x in (run / "timeline.jsonl").read_text().splitlines() if x.strip()]
        if len(timeline) >= 2:
            prefill_s += timeline[-1]["engine_prefill_s"] - timeline[0]["engine_prefill_s"]
            prefill_tokens += timeline[-1]["engine_prefill_tokens"] - timeline[0]["engine_prefill_tokens"]
            decode_s += timeline[-1]["engine_decode_s"] - timeline[0]["engine_decode_s"]
    return {
        "points": points,
        "sync": sync,
        "reward": reward,
        "decode_s": decode_s,
        "prefill": prefill_s / prefill_tokens if prefill_tokens > 0 else None,
    }


def machine_profile(
    results_dir: str | Path | None = None, runs: Sequence[str | Path] = (), name: str | None = None
) -> CostProfile:
    """This machine's profile from the committed results (and ``runs``, real run directories);
    named ``cpu-2core-tiny`` (``cpu-2core-tiny-runs`` when runs refine it) unless ``name``."""
    name = name or ("cpu-2core-tiny-runs" if runs else "cpu-2core-tiny")
    results = Path(results_dir) if results_dir else (REPO_RESULTS if REPO_RESULTS.is_dir() else Path("docs/results"))
    decode = json.loads((results / DECODE_FILE).read_text())
    base, per_seq, per_ctx, worst = fit_decode(decode["rows"])
    rows = trainer_rows(results)
    if not rows:
        raise FileNotFoundError(f"no synchronous bench async/headline rows under {results}")
    points = [(r["trained_tokens"] / r["steps"], r["train_step_s"]) for r in rows]
    sync_s = statistics.median(r["weight_sync_s"] for r in rows if r.get("weight_sync_s") is not None)
    loads = [r["time_budget"]["engine_update_s"] / r["steps"] for r in rows if r.get("time_budget")]
    update_s = statistics.median(loads) if loads else 0.0
    measured: dict[str, Any] = {"points": [], "sync": [], "reward": [], "prefill": None, "decode_s": 0.0}
    if runs:
        measured = _run_measurements(runs)
    from_runs = len(measured["points"]) >= MIN_RUN_POINTS
    if from_runs:  # the runs' own workload: a trainer step's cost per token depends on the lengths
        points = measured["points"]
    t_base, t_per_token = fit_line(points)
    if measured["sync"]:
        sync_s = statistics.median(measured["sync"])
    prefill = measured["prefill"] if measured["prefill"] is not None else per_seq
    reward = statistics.median(measured["reward"]) if measured["reward"] else 0.0
    files = sorted({r["_file"] for r in rows})
    run_names = ", ".join(str(r) for r in runs)
    sources = [
        Source(
            "engine.decode_*",
            "measured",
            f"docs/results/{DECODE_FILE} ({len(decode['rows'])} rows of `python -m "
            f"benchmarks decode`, one torch thread) fitted on relative error; worst row off by {worst:.0%}",
        ),
        Source(
            "trainer.base_s, trainer.per_token_s",
            "measured",
            f"per-step train_step_s against trained_tokens of {run_names} (the runs' workload only: "
            "a token of a long sequence costs more than one of a short one)"
            if from_runs
            else f"mean step time against trained tokens per step of the {len(rows)} max_staleness=0 rows of "
            f"{', '.join(files)} (trainer alone, one thread, packed micro-batches, proximal forward included)",
        ),
        Source(
            "sync.export_s, engine.update_s",
            "measured",
            "median weight_sync_s of the same rows minus the engine's own load time (time_budget."
            "engine_update_s per step of bench_headline_reason.json)" + (f"; sync from {run_names}" if runs else ""),
        ),
        Source(
            "engine.prefill_per_token_s",
            "measured" if measured["prefill"] is not None else "assumption",
            f"timeline prefill seconds per prefill token of {run_names}"
            if measured["prefill"] is not None
            else "a prompt token costs one row of a decode step (LocalEngine runs prefill rows in the decode forward): "
            "engine.decode_per_seq_s",
        ),
        Source(
            "reward.latency_s",
            "measured" if measured["reward"] else "assumption",
            f"median reward_latency_p50_s of {run_names}"
            if measured["reward"]
            else "0: the arithmetic verifier scores inline in microseconds (controller/report.py notes it)",
        ),
        Source("engine.max_slots", "published", "rollout.max_slots default of the config (128)"),
        Source("trainer.parallel_efficiency", "assumption", "1.0: one trainer rank on this machine"),
    ]
    profile = CostProfile(
        name=name,
        hardware="this 2-core CPU machine: the engine on one thread, the trainer process on the other",
        model="the tiny default policy (800,384 parameters, character tokenizer)",
        engine=EngineCost(base, per_seq, per_ctx, prefill, update_s, max_slots=128, slot_prefix_rows=bool(runs)),
        trainer=TrainerCost(t_base, t_per_token),
        sync=SyncCost(max(0.0, sync_s - update_s)),
        reward=RewardCost(reward),
        sources=tuple(sources),
        notes="Written by `python -m benchmarks profile` from committed measurements; rerun it after new ones.",
        extra={"decode_table": decode.get("table"), "trainer_points": [[round(x), round(y, 4)] for x, y in points]},
    )
    return _in_run_decode(profile, runs, measured["decode_s"]) if runs and measured["decode_s"] > 0 else profile


def _in_run_decode(profile: CostProfile, runs: Sequence[str | Path], measured_s: float) -> CostProfile:
    """``profile`` with its decode costs scaled to the runs' engines (``decode_scale``), saying so."""
    scale = decode_scale(profile, runs, measured_s)
    note = (
        f"; LocalEngine's slot layout (engine.slot_prefix_rows: idle rows, padded attention) and scaled by "
        f"{scale:.3f}, with which the simulations of {', '.join(map(str, runs))} (their own config and prompts "
        f"in order, seed 0) decode for as long as their engines did ({measured_s:.1f} s)"
    )
    sources = tuple(replace(s, source=s.source + note) if s.fields == "engine.decode_*" else s for s in profile.sources)
    return replace(
        profile,
        engine=scale_decode(profile.engine, scale),
        sources=sources,
        extra={**profile.extra, "decode_scale": scale},
    )
