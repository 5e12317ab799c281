"""The simulated engines together: their summed counters and the routing of requests over them.

Owns ``EngineTotals`` (the counters of all engines together, ``LocalEngine.stats`` names) and
``Router`` (``rollout.pool.EnginePool``'s routing: the engine with the fewest samples in flight, ties to the
lower index). One engine's scheduler and costs are ``sim.engine``'s.
"""

from __future__ import annotations

import heapq


class EngineTotals:
    """Cumulative counters of all engines (``LocalEngine.stats`` names, summed as ``EnginePool``)."""

    __slots__ = (
        "generated",
        "decode_steps",
        "decode_tokens",
        "decode_s",
        "prefill_s",
        "prefill_tokens",
        "update_s",
        "running_s",
        "running",
        "waiting",
    )

    def __init__(self) -> None:
        self.generated = self.decode_steps = self.decode_tokens = self.prefill_tokens = 0
        self.decode_s = self.prefill_s = self.update_s = 0.0
        self.running_s = 0.0
        """Running sequences integrated over time (sequence-seconds), all engines."""
        self.running = self.waiting = 0
        """Sequences running and requests waiting, all engines (as of each engine's last event)."""


class Router:
    """``EnginePool``'s routing: the engine with the fewest samples in flight (ties: lower index)."""

    def __init__(self, engines: int) -> None:
        self.load = [0] * engines
        self._heap = [(0, i) for i in range(engines)]

    def pick(self) -> int:
        heap, load = self._heap, self.load
        while heap[0][0] != load[heap[0][1]]:
            heapq.heappop(heap)
        return heap[0][1]

    def add(self, engine: int, samples: int) -> None:
        """``samples`` more (or fewer, when negative) samples in flight on ``engine``."""
        self.load[engine] += samples
        heapq.heappush(self._heap, (self.load[engine], engine))
        if len(self._heap) > 8 * len(self.load) + 1024:  # drop the outdated entries
            self._heap = [(n, i) for i, n in enumerate(self.load)]
            heapq.heapify(self._heap)
