"""Controlled staleness (``controller.fixed_lag = k``): the engine's weights trail the trainer's by k.

Training step i is trained on samples generated entirely by version ``max(0, i - k)``, whatever
the speed of the machine: admission is synchronous (the staleness gate runs with η = 0, so the
batch of step i is generated after step i - 1 published, and nothing is in flight at an update),
and after step i publishes version i + 1 the engine loads version ``i + 1 - k`` instead, taken from
a ring of the last k + 1 exports (in-process tensors; CPU copies for the tiny model), seeded with
the export of the initial weights (``start``). Before version k + 1 exists the engine keeps the
initial weights (version 0): the engine always holds the oldest export in the ring. So every token of the batch
of step i carries version ``max(0, i - k)`` (the engine stamps the version it loaded), and the
prompt order is the seeded ``PromptSource``'s, identical for every arm at the same seed (with
``algo.filter_equal_rewards=false`` every admitted group is trained, so step i trains exactly
prompts ``i·B .. (i+1)·B - 1`` of the stream). k = 0 is ordinary synchronous training.

The final held-out evaluation measures the trained policy, not the lagged one: ``finish`` leaves the
engine on the newest weights at the end of the run (the launcher's ``accuracy_after``). Evaluation
during the run (``controller.eval_every``) is refused with a fixed lag: it would have to swap the
engine's weights while the next batch is already generating.

Not resumable: the ring is not part of a checkpoint (``check_resume``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable

from asyncrl.rollout.api import RolloutEngine
from asyncrl.types import WeightUpdate

__all__ = ["LaggedWeights"]


class LaggedWeights:
    """The ring of exports and what the engine should hold (see the module docstring)."""

    def __init__(self, lag: int) -> None:
        if lag < 0:
            raise ValueError(f"fixed lag must be >= 0, got {lag}")
        self.lag = lag
        self._ring: deque[WeightUpdate] = deque(maxlen=lag + 1)

    @property
    def engine_version(self) -> int:
        """The version the engine holds: the oldest in the ring (0 before ``start``)."""
        return self._ring[0].version if self._ring else 0

    async def start(self, export: Callable[[], Awaitable[WeightUpdate]]) -> None:
        """Seed the ring with the export of the weights the engine starts from (``export()``)."""
        if not self._ring:
            self._ring.append(await export())

    @property
    def latest(self) -> WeightUpdate | None:
        """The newest export (None before the first step)."""
        return self._ring[-1] if self._ring else None

    def select(self, update: WeightUpdate) -> WeightUpdate | None:
        """Record the export ``update`` (version v) and return the one the engine loads now: version
        ``v - k``; None while ``v - k <= 0`` (the engine keeps its initial weights)
        (k = 0: ``update`` itself)."""
        if self._ring and update.version != self._ring[-1].version + 1:
            raise ValueError(f"exports must come one version at a time: {self._ring[-1].version} then {update.version}")
        self._ring.append(update)
        target = update.version - self.lag
        if target <= 0:
            return None
        chosen = self._ring[0]
        if chosen.version != target:  # the ring holds versions v - k .. v once it is full
            raise RuntimeError(f"fixed lag {self.lag}: version {target} is not in the ring (call start first)")
        return chosen

    async def publish(self, engine: RolloutEngine, update: WeightUpdate) -> None:
        """Load the lagged weights for ``update`` into ``engine`` (nothing while the lag has not passed)."""
        target = self.select(update)
        if target is not None:
            await engine.update_weights(target)

    async def finish(self, engine: RolloutEngine) -> None:
        """Leave ``engine`` on the newest weights (the run's final evaluation measures the trained policy)."""
        latest = self.latest
        if latest is not None and latest.version != self.engine_version:
            await engine.update_weights(latest)
            self._ring.clear()
            self._ring.append(latest)

    @staticmethod
    def check_resume(lag: int | None, resuming: bool) -> None:
        """A run with a fixed lag > 0 cannot resume: its ring of exports is not checkpointed."""
        if resuming and lag:
            raise ValueError(
                "controller.fixed_lag > 0 cannot resume a run (the last k weight exports are not checkpointed)"
            )
