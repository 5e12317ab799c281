"""Episodes waiting on tools, read from a run's ledger: the waits, how many wait at each moment, and
what share of the episodes' time in flight went to waiting.

Owns the reading of ``tool_wait`` ([start, end] on the RL clock, the clock of ``timeline.jsonl``'s
``t``; ``rundir.episode_entry``), which a multi-turn sample's ledger line holds for every turn whose
tool calls an environment step answered. ``asyncrl report`` draws ``waiting_over_time`` on its
timeline; ``python -m benchmarks agent-throughput`` reports ``tool_wait_share``. Pure functions over the
parsed lines (no file access).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["tool_wait_share", "tool_waits", "waiting_over_time"]


def tool_waits(ledger: Sequence[dict[str, Any]]) -> list[tuple[float, float]]:
    """Every (start, end) of a tool wait in the ledger's sample lines, in order of start."""
    waits = [
        (float(turn["tool_wait"][0]), float(turn["tool_wait"][1]))
        for line in ledger
        for turn in line.get("turns") or ()
        if turn.get("tool_wait") is not None
    ]
    return sorted(waits)


def waiting_over_time(waits: Sequence[tuple[float, float]]) -> tuple[list[float], list[int]]:
    """How many episodes wait on a tool from each time on (a step function: ``counts[i]`` holds from
    ``times[i]`` until ``times[i + 1]``); empty lists for no wait. An end and a start at the same time
    give one point (the count after both)."""
    events: dict[float, int] = {}
    for start, end in waits:
        events[start] = events.get(start, 0) + 1
        events[end] = events.get(end, 0) - 1
    times, counts, level = [], [], 0
    for t in sorted(events):
        level += events[t]
        times.append(t)
        counts.append(level)
    return times, counts


def tool_wait_share(
    ledger: Sequence[dict[str, Any]], timeline: Sequence[dict[str, Any]], end_s: float | None = None
) -> float | None:
    """Seconds episodes spent waiting on a tool over the episode-seconds in flight, from the start of RL to
    ``end_s`` (default: the last timeline sample). The denominator integrates ``generating_samples`` of
    ``timeline.jsonl`` (samples admitted and not yet ended: decoding, queued in the engine or waiting on a
    tool), each sample's value holding until the next; the waits are clipped to the same span. Waits of
    episodes still in flight when the run stopped are not in the ledger (a slight undercount). None when
    no sample was in flight."""
    if len(timeline) < 2:
        return None
    end = float(timeline[-1]["t"]) if end_s is None else end_s
    in_flight = 0.0
    for here, after in zip(timeline, timeline[1:], strict=False):
        t0, t1 = float(here["t"]), min(float(after["t"]), end)
        if t1 > t0:
            in_flight += float(here.get("generating_samples", 0.0)) * (t1 - t0)
    if in_flight <= 0:
        return None
    waiting = sum(max(0.0, min(stop, end) - max(start, 0.0)) for start, stop in tool_waits(ledger))
    return waiting / in_flight
