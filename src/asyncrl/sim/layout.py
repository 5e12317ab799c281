"""The decode-step cost of ``LocalEngine``'s slot layout, for the simulated engine.

Owns ``SlotLayout``: which KV slot each running sample of one simulated engine holds, and what a
decode step costs when it is computed the way ``rollout.engine.LocalEngine`` computes it
(``EngineCost.slot_prefix_rows``):

- a sample takes the lowest free slot (``rollout.scheduler``), and a step computes a row for every
  slot in ``[0, rows)``, ``rows`` = the highest slot in use + 1: an emptied slot below a running
  sample is an idle row (position 0);
- attention (``rollout.kv_forward.SlotKVForward.plan_split``): every row attends over the same
  padded key length ``short`` (the next multiple of 16 above the ``k + 1``-th largest position of the
  rows, ``k = max(1, rows // 8)``, at least 48), and the rows at or past it attend again over the
  longest length; no split (every row over the longest length) with fewer than 8 rows, a longest
  length under 96, or less than 48 keys to save.

So one step costs ``base + per_seq x running + per_ctx x keys`` with ``keys = rows x short + long
rows x longest``, where a packed engine's ``per_ctx x sum(contexts)`` counts each row's own context.
On a long-tailed workload this is the difference that matters: a few long samples scattered over
the slots make every step attend over most rows' padded length. The per-sequence term stays per
running sample: with this machine's tiny policy a row's matmuls are cheap against a sample's own
work in a step (sampling, appending, stop checks), and charging idle rows for it too predicts the
task runs' engine occupancy far too high (docs/simulator.md §5.1).

Between two changes of the running set the positions all grow by one per step, so their order and
the rows do not change and the cost grows linearly: ``cost(step)`` gives the step's cost and its
increase per later step, which the engine's closed forms take (the padded length's rounding to 16
and a row crossing it in between are ignored). A sample's position at step ``s`` is ``s + u`` with
``u = final context - last step`` fixed at its join, so the running samples are kept as a sorted
list of ``u``.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort

SPLIT_MIN_KEYS = 48
"""``SlotKVForward.split_min_keys``."""


class SlotLayout:
    """The slots and positions of one engine's running samples (see the module docstring)."""

    __slots__ = ("a", "b", "c", "free", "used", "rows", "us")

    def __init__(self, slots: int, base_s: float, per_row_s: float, per_key_s: float) -> None:
        self.a, self.b, self.c = base_s, per_row_s, per_key_s
        self.free = list(range(slots))
        """Free slots, a heap: the lowest is taken first."""
        self.used = bytearray(slots)
        self.rows = 0
        """Highest slot in use + 1."""
        self.us: list[int] = []
        """Sorted ``final context - last step`` of the running samples (position = step + u)."""

    def take(self, u: int) -> int:
        """A sample joins: its slot (the lowest free one)."""
        slot = heapq.heappop(self.free)
        self.used[slot] = 1
        if slot >= self.rows:
            self.rows = slot + 1
        insort(self.us, u)
        return slot

    def hide(self, slot: int, u: int) -> None:
        """The sample in ``slot`` stops running (``rows`` shrinks past the empty slots at the top);
        its slot is not yet free for others (``release``), so a plan can ``show`` it again."""
        used = self.used
        used[slot] = 0
        del self.us[bisect_left(self.us, u)]
        rows = self.rows
        while rows and not used[rows - 1]:
            rows -= 1
        self.rows = rows

    def show(self, slot: int, u: int) -> None:
        """Undo ``hide``."""
        self.used[slot] = 1
        if slot >= self.rows:
            self.rows = slot + 1
        insort(self.us, u)

    def release(self, slot: int, u: int) -> None:
        """The sample in ``slot`` ended: its slot is free."""
        self.hide(slot, u)
        heapq.heappush(self.free, slot)

    def clear(self) -> None:
        """Every running sample left (an abort that sends them back to the queue)."""
        self.free = list(range(len(self.used)))
        self.used = bytearray(len(self.used))
        self.rows = 0
        self.us = []

    def keys(self, step: int) -> tuple[int, int]:
        """``(keys, growth)``: the attention keys of a decode step at ``step`` and their increase per
        later step (the running set unchanged)."""
        us, rows = self.us, self.rows
        n = len(us)
        if not n:
            return 0, 0
        longest = us[-1] + step + 1
        if rows < 8 or longest < 2 * SPLIT_MIN_KEYS:
            return rows * longest, rows
        k = max(1, rows // 8)
        if n > k:  # the (k + 1)-th largest position is a running sample's, growing with it
            short = max(-(-(us[n - k - 1] + step + 1) // 16) * 16, SPLIT_MIN_KEYS)
            short_growth = rows
        else:  # an idle row's (position 0)
            short, short_growth = SPLIT_MIN_KEYS, 0
        if longest - short < SPLIT_MIN_KEYS:
            return rows * longest, rows
        long_rows = n - bisect_left(us, short - step)  # the rows at or past ``short``
        return rows * short + long_rows * longest, short_growth + long_rows

    def cost(self, step: int) -> tuple[float, float]:
        """``(seconds of the decode step at step, increase per later step)``."""
        keys, growth = self.keys(step)
        return self.a + self.b * len(self.us) + self.c * keys, self.c * growth
