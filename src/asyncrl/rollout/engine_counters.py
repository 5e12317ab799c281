"""``EngineCounters``: the cumulative counters of one ``LocalEngine`` and the exact integral of its running samples.

The engine's thread adds to ``values`` (tokens, steps, prefill and decode time, updates, aborts, prefix hits) and
marks every change of the running-sample count; ``LocalEngine.stats`` reads them from any thread. What one
engine step adds is here (``count_step``, ``charge_time``); the step itself is ``rollout.engine``'s.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the counters need no torch: the engine pool reads their names
    from asyncrl.rollout.scheduler import StepPlan

__all__ = ["COUNTER_NAMES", "EngineCounters"]

COUNTER_NAMES = (
    "generated_tokens",
    "decode_tokens",
    "decode_steps",
    "busy_s",
    "decode_s",
    "prefill_s",
    "prefill_tokens",
    "prefill_padded_tokens",
    "prefill_batches",
    "kv_copied_tokens",
    "aborted_requests",
    "aborted_samples",
    "finished_samples",
    "requests",
    "weight_updates",
    "update_s",
    "keep_interrupted_samples",
    "prefix_reused_tokens",
    "prefix_hits",
)
"""The cumulative counters of ``LocalEngine.stats`` (its derived figures are computed there)."""


class EngineCounters:
    """The counters of one engine (see the module docstring)."""

    def __init__(self) -> None:
        self.values: dict[str, float] = dict.fromkeys(COUNTER_NAMES, 0.0)
        self._occupancy = (0.0, time.perf_counter(), 0)
        """(running_sample_s settled up to ``when``, ``when``, samples running since then): one tuple,
        replaced whole, so that a reader on another thread sees a consistent triple."""

    def mark_occupancy(self, running: int) -> float:
        """Settle the running-sample integral up to now at the count held since the last mark, then hold
        ``running`` from now on; returns now."""
        now = time.perf_counter()
        settled, since, held = self._occupancy
        self._occupancy = (settled + held * (now - since), now, running)
        return now

    def running_sample_s(self) -> float:
        """The integral over time of the running samples, up to now (from any thread)."""
        now = time.perf_counter()  # before the tuple: a mark after it cannot leave ``since`` past ``now``
        settled, since, running = self._occupancy
        return settled + running * max(0.0, now - since)

    def count_step(self, plan: StepPlan) -> None:
        """What one step's plan adds: decode rows, prompts prefilled (computed, padded, reused, KV copies)
        and the tokens sampled (one per decode row, one first token per prefilled sample)."""
        v = self.values
        if plan.num_decode:
            v["decode_steps"] += 1
            v["decode_tokens"] += plan.num_decode
            v["generated_tokens"] += plan.num_decode
        if plan.prefills:
            computed = [len(p.request.prompt) - p.reused for p in plan.prefills]
            v["prefill_tokens"] += sum(computed)
            v["prefill_padded_tokens"] += len(computed) * max(computed)
            v["prefill_batches"] += 1
            for prefill in plan.prefills:
                v["kv_copied_tokens"] += len(prefill.request.prompt) * (len(prefill.slots) - 1)
                v["prefix_reused_tokens"] += prefill.reused
                v["prefix_hits"] += prefill.reused > 0
            v["generated_tokens"] += sum(len(p.slots) for p in plan.prefills)

    def charge_time(self, plan: StepPlan, schedule_s: float, run_s: float) -> None:
        """Split a step's time: a step with prompts is charged to prefill in proportion to its rows."""
        prompt_tokens = plan.num_prefill_tokens
        share = prompt_tokens / max(1, prompt_tokens + plan.num_decode)
        self.values["prefill_s"] += schedule_s + share * run_s
        self.values["decode_s"] += (1 - share) * run_s
