"""The staleness gate: how many new prompt groups may be admitted now (DESIGN §4.1).

AReaL's rule, in prompt groups: with B groups per training step, η = ``max_staleness`` and the
trainer at version v, admission capacity is::

    min(max_concurrent - running, (η + v + 1) * B - (accepted + running))

where ``accepted`` counts groups that finished and entered the buffer (trained or waiting) and
``running`` counts groups admitted and not finished. Groups rejected by a filter (dynamic
sampling, failed verification) give their budget back. η = 0 admits exactly one batch per
version: synchronous on-policy training in the same code.

The counters are part of the checkpoint (a known AReaL failure after recovery: counters reset,
staleness grows past η), see ``state_dict``/``load_state_dict``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StalenessGate:
    batch_size: int
    max_staleness: int
    max_concurrent: int
    high_water: int = 0
    """Most groups buffered + running (0: no high-water mark)."""
    accepted: int = 0
    running: int = 0

    def __post_init__(self) -> None:
        if self.batch_size <= 0 or self.max_concurrent <= 0 or self.max_staleness < 0 or self.high_water < 0:
            raise ValueError(
                "StalenessGate: batch_size, max_concurrent > 0 and max_staleness, high_water >= 0 required"
            )

    def capacity(self, version: int, buffered: int = 0) -> int:
        """Groups that may be admitted now, with the trainer at ``version`` and ``buffered``
        finished groups waiting to be trained (never negative)."""
        by_staleness = (self.max_staleness + version + 1) * self.batch_size - (self.accepted + self.running)
        by_concurrency = self.max_concurrent - self.running
        cap = min(by_staleness, by_concurrency)
        if self.high_water > 0:
            cap = min(cap, self.high_water - (buffered + self.running))
        return max(0, cap)

    def on_admit(self, n: int = 1) -> None:
        """``n`` groups were admitted (they are now running)."""
        self.running += n

    def on_finish(self, accepted: bool) -> None:
        """A running group finished: into the buffer (``accepted``) or rejected by a filter."""
        if self.running <= 0:
            raise RuntimeError("StalenessGate.on_finish without a running group")
        self.running -= 1
        if accepted:
            self.accepted += 1

    def on_cancel(self) -> None:
        """A running group was cancelled (shutdown, engine failure): it will be admitted again."""
        self.on_finish(accepted=False)

    def on_drop_accepted(self) -> None:
        """An accepted group was later dropped as too stale: its budget is given back."""
        self.accepted = max(0, self.accepted - 1)

    def state_dict(self) -> dict[str, int]:
        """Counters for a checkpoint; running groups are not saved (they are re-admitted)."""
        return {"accepted": self.accepted}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.accepted = int(state["accepted"])
        self.running = 0
