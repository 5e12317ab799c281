"""Where a finished run's time went, from its ``timeline.jsonl`` and ``metrics.jsonl``.

The headline's explanation (is the engine the bottleneck? how full is it? is the trainer idle?
did the asynchronous run win on steps or on tokens?) rests on these figures; computing them here
puts them in the committed result rows instead of in someone's notes. All times are seconds of RL
time; the run "ends" at the end of its last training step, as in ``controller/throughput.py``.

- ``engine_decode_s`` / ``engine_prefill_s`` / ``engine_update_s``: the engine's own cumulative
  counters over the run; ``engine_decode_frac`` the share of the run spent decoding.
- ``mean_engine_running``: sequences in the engine's running batch, averaged over time (timeline
  samples weighted by the interval each one opens).
- ``trainer_busy_frac``: the share of time the trainer was inside a step (same weighting).
- ``steps_by_s``: for each of ``checkpoints_s``, the training steps ended by then.
- ``early_response_len``: mean response length of the first ``early_steps`` steps' batches (the
  length bias of asynchronous batching shows here).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["held_integral", "time_budget"]


def held_integral(points: Sequence[tuple[float, float]], start: float, end: float) -> tuple[float, float]:
    """``(area, covered)``: the integral over ``[start, end]`` of a signal sampled at ``points`` ((time,
    value) in time order), each value held until the next sample (the last until ``end``), and the
    seconds of ``[start, end]`` the samples cover (none before the first)."""
    area = covered = 0.0
    if not points:
        return area, covered
    for (t0, value), (t1, _) in zip(points, [*points[1:], (end, 0.0)], strict=True):
        lo, hi = max(t0, start), min(t1, end)
        if hi > lo:
            area += value * (hi - lo)
            covered += hi - lo
    return area, covered


def _time_weighted_mean(times: Sequence[float], values: Sequence[float], end: float) -> float:
    """Mean of a sampled signal over [times[0], end], each sample held until the next."""
    area, covered = held_integral(list(zip(times, values, strict=True)), times[0] if times else 0.0, end)
    return area / covered if covered > 0 else 0.0


def _counter_delta(timeline: Sequence[dict[str, Any]], key: str, end: float) -> float:
    """Increase of a cumulative counter from the first sample to the last one at or before ``end``."""
    inside = [float(s[key]) for s in timeline if float(s["t"]) <= end and key in s]
    return inside[-1] - inside[0] if len(inside) >= 2 else 0.0


def time_budget(
    metrics: Sequence[dict[str, Any]],
    timeline: Sequence[dict[str, Any]],
    *,
    checkpoints_s: Sequence[float] = (60.0, 130.0),
    early_steps: int = 5,
) -> dict[str, Any]:
    """The figures of the module docstring for one run; raises ``ValueError`` for a run with no
    step or no timeline."""
    if not metrics or not timeline:
        raise ValueError("a run with no training step or no timeline has no time budget")
    end = max(float(m["time_s"]) for m in metrics)
    times = [float(s["t"]) for s in timeline]
    decode_s = _counter_delta(timeline, "engine_decode_s", end)
    early = [float(m["response_len"]) for m in metrics[:early_steps] if "response_len" in m]
    return {
        "rl_wall_s": end,
        "engine_decode_s": decode_s,
        "engine_prefill_s": _counter_delta(timeline, "engine_prefill_s", end),
        "engine_update_s": _counter_delta(timeline, "engine_update_s", end),
        "engine_decode_frac": decode_s / end if end > 0 else 0.0,
        "mean_engine_running": _time_weighted_mean(times, [float(s.get("engine_running", 0)) for s in timeline], end),
        "trainer_busy_frac": _time_weighted_mean(times, [float(bool(s.get("trainer_busy"))) for s in timeline], end),
        "steps_by_s": {f"{t:g}": sum(float(m["time_s"]) <= t for m in metrics) for t in checkpoints_s},
        "early_response_len": sum(early) / len(early) if early else None,
    }
