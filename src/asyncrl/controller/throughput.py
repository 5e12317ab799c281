"""Throughput of a finished run, measured so that pipeline inventory cannot flatter it.

An asynchronous run trains, in any window, samples that were generated before it (the buffer and
the engine's in-flight samples are inventory), and leaves untrained samples behind when it stops.
Counting the *trained* tokens of the steps inside a window therefore rewards a run that carried
inventory into it. This module counts what the pipeline *produced* inside the window instead:

    steady_state = (generated_in_window - never_finished) * trained_per_generated / window_seconds

``generated_in_window`` comes from the engine's own token counter (``timeline.jsonl``), so
nothing generated before the window counts. ``never_finished`` is every token the engine
generated during RL that no finished sample accounts for: samples still buffered or generating
when the run stopped, attempts that failed and were retried, evaluations run during RL
(``controller.eval_every``). All of it is taken out of the window, as if it had all been made
there (an overcount for a run whose leftovers were partly made before the window, so the measure
errs against the run with more inventory at the end: the asynchronous one). What remains is as if
the run had ended with a drain. ``trained_per_generated`` is the run's ratio of trained tokens
(prompt + response of every trained sample) to generated tokens of the samples that finished
(trained, filtered, stale, skipped: a filtered group costs generation and trains nothing), from
the ledger (a multi-turn episode's generated tokens are its model tokens: the environment's are
prefilled). The window opens ``warmup_s`` seconds of RL time after the start, the same for every
arm, and closes at the end of the last training step. The whole-run figure (trained tokens over
RL wall time) is reported beside it.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

FINISHED = ("trained", "filtered", "stale", "skipped")
"""Ledger statuses of samples whose generation ended (their tokens are all generated)."""


def generated_tokens(line: dict[str, Any]) -> int:
    """The tokens the engine generated for one finished ledger sample: a multi-turn episode's model
    tokens (``model_tokens``; its ``response_len`` also holds the environment's tokens, which are
    prefilled, not generated), else its response."""
    return int(line.get("model_tokens", line["response_len"]))


@dataclass(frozen=True)
class Throughput:
    """The throughput figures of one run (tokens per second of RL wall time)."""

    steady_state_tokens_per_s: float
    """Generated tokens in the window x trained per generated token, over the window."""
    whole_run_tokens_per_s: float
    """Trained tokens over the RL wall time of the whole run."""
    window_trained_tokens_per_s: float
    """Trained tokens of the steps that ended in the window, over the window: the measure that
    inventory carried into the window flatters (kept for comparison only)."""
    trained_per_generated: float
    generated_in_window: float
    never_finished_tokens: float
    """Tokens generated during RL that no finished sample accounts for (taken out of the window)."""
    window_start_s: float
    window_end_s: float

    def as_row(self) -> dict[str, float]:
        return asdict(self)


def _counter_at(times: Sequence[float], values: Sequence[float], t: float) -> float:
    """The cumulative counter at time ``t``, linearly interpolated between timeline samples."""
    i = bisect.bisect_right(times, t)
    if i == 0:
        return values[0]
    if i == len(times):
        return values[-1]
    t0, t1, v0, v1 = times[i - 1], times[i], values[i - 1], values[i]
    return v0 + (v1 - v0) * (t - t0) / max(t1 - t0, 1e-12)


def measure_throughput(
    metrics: Sequence[dict[str, Any]],
    ledger: Sequence[dict[str, Any]],
    timeline: Sequence[dict[str, Any]],
    *,
    warmup_s: float,
) -> Throughput:
    """The throughput figures of a run from its ``metrics.jsonl``, ledger and ``timeline.jsonl``.

    Raises ``ValueError`` when the run ends before ``warmup_s`` (no window to measure)."""
    if not metrics or not timeline:
        raise ValueError("a run with no training step or no timeline has no throughput")
    end = float(metrics[-1]["time_s"])
    if end <= warmup_s:
        raise ValueError(f"the run's RL time ({end:.1f} s) does not pass the warm-up ({warmup_s:.1f} s)")
    trained = sum(m["trained_tokens"] for m in metrics if m.get("applied", True))
    generated = sum(generated_tokens(r) for r in ledger if r.get("status") in FINISHED)
    per_generated = trained / max(generated, 1)
    times = [float(s["t"]) for s in timeline]
    counter = [float(s["engine_generated_tokens"]) for s in timeline]
    in_window = _counter_at(times, counter, end) - _counter_at(times, counter, warmup_s)
    never_finished = max(0.0, _counter_at(times, counter, end) - _counter_at(times, counter, 0.0) - generated)
    window = end - warmup_s
    window_trained = sum(
        m["trained_tokens"] for m in metrics if m.get("applied", True) and float(m["time_s"]) > warmup_s
    )
    return Throughput(
        steady_state_tokens_per_s=max(0.0, in_window - never_finished) * per_generated / window,
        whole_run_tokens_per_s=trained / end,
        window_trained_tokens_per_s=window_trained / window,
        trained_per_generated=per_generated,
        generated_in_window=in_window,
        never_finished_tokens=never_finished,
        window_start_s=warmup_s,
        window_end_s=end,
    )
