"""The staleness gate: how many new prompt groups may be admitted now (DESIGN §4.1).

AReaL's rule, in prompt groups: with B groups per training step, η = ``max_staleness`` and the
trainer at version v, admission capacity is::

    min(max_concurrent - running, (η + v + 1) * B - (accepted + running))

where ``accepted`` counts groups that finished and entered the buffer (trained or waiting) and
``running`` counts groups admitted and not finished. Groups rejected by a filter (dynamic
sampling, failed verification) give their budget back. η = 0 admits exactly one batch per
version: synchronous on-policy training in the same code.

The high-water mark (``high_water``, in groups; 0: none) further keeps buffered + running groups
below it, so that the engine does not run ahead of a trainer-bound loop. It counts in one of two
units (``high_water_unit``):

- ``groups``: a running group counts whole until its last sample ends;
- ``samples``: a running group weighs only its samples still generating (``generating``, kept by
  the controller through ``EpisodeSamples``), so a group that waits for its one long sample holds
  one sample's share, not G. The mark is ``high_water * group_size`` samples, buffered groups weigh
  ``group_size`` each, and admission rounds up, so the samples generating never exceed the mark
  by G or more (a retried episode aside: its samples count again from its new attempt). The
  buffer is bounded more loosely than with ``groups`` (a group whose samples have all ended
  weighs nothing until it is buffered), so this unit is for generation-bound loops,
  where the buffer drains at once: on a long-tailed workload it keeps the engine full, and the
  staleness rule still bounds how far ahead it runs.

The counters are part of the checkpoint (a known AReaL failure after recovery: counters reset,
staleness grows past η), see ``state_dict``/``load_state_dict``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from asyncrl.choices import HighWaterUnit, check_choice


def group_bound(own: int | None, max_staleness: int) -> int:
    """The staleness bound a group is trained within: its own (``own``, the η in force when it was
    admitted under ``controller.adaptive``; None: none), never above the run's ``max_staleness``. The
    buffer (``GroupBuffer.take_fresh``), the ledger check and the simulator all apply this rule."""
    return max_staleness if own is None else min(own, max_staleness)


def must_wait_for_stragglers(step: int, batch_size: int, buffered: Iterable[int], running: Iterable[int]) -> bool:
    """``controller.stragglers=wait``: whether training step ``step`` waits for groups still generating.
    ``buffered`` and ``running``: the last trainable step (first token's version + bound; for a running
    group, its admission version + bound, which is never later) of each buffered and each running group.

    The batch takes the ``batch_size`` buffered groups due soonest. The rest, with the running ones, must
    fit the later steps: the groups due by step d have (d − step)·B places in steps step + 1 … d. Waiting
    is right when some d overflows and a running group is due by d (it can take a place in this batch
    once it has finished); when only buffered groups overflow, waiting cannot help (taking the soonest
    due first is already the best order). With the gate's budget this keeps every group trainable: the
    groups admitted by version v number at most (v + η + 1)·B, so they fit steps up to v + η if each step
    takes the ones due soonest among those that have finished. A group due before ``step`` is ignored
    (it is already past its bound, or finishes fresher than its admission version says)."""
    late = sorted(d for d in running if d >= step)
    if not late:
        return False
    due = sorted([*sorted(d for d in buffered if d >= step)[batch_size:], *late])
    return any(k + 1 > (d - step) * batch_size and d >= late[0] for k, d in enumerate(due))


@dataclass
class StalenessGate:
    batch_size: int
    max_staleness: int
    max_concurrent: int
    high_water: int = 0
    """Most groups buffered + running (0: no high-water mark)."""
    high_water_unit: HighWaterUnit = "groups"
    """groups | samples: what a running group weighs under the mark (module docstring)."""
    group_size: int = 1
    """Samples per group (the ``samples`` unit)."""
    accepted: int = 0
    running: int = 0
    generating: int = 0
    """Samples of running groups still generating (the ``samples`` unit)."""

    def __post_init__(self) -> None:
        if self.batch_size <= 0 or self.max_concurrent <= 0 or self.max_staleness < 0 or self.high_water < 0:
            raise ValueError(
                "StalenessGate: batch_size, max_concurrent > 0 and max_staleness, high_water >= 0 required"
            )
        check_choice(self.high_water_unit, HighWaterUnit, "high_water_unit")
        if self.group_size <= 0:
            raise ValueError(f"StalenessGate: group_size must be > 0, got {self.group_size}")

    def capacity(self, version: int, buffered: int = 0) -> int:
        """Groups that may be admitted now, with the trainer at ``version`` and ``buffered``
        finished groups waiting to be trained (never negative)."""
        by_staleness = (self.max_staleness + version + 1) * self.batch_size - (self.accepted + self.running)
        by_concurrency = self.max_concurrent - self.running
        cap = min(by_staleness, by_concurrency)
        if self.high_water > 0:
            match self.high_water_unit:
                case "groups":
                    room = self.high_water - (buffered + self.running)
                case "samples":
                    g = self.group_size
                    free = self.high_water * g - (buffered * g + self.generating)
                    room = -(-free // g) if free > 0 else 0
            cap = min(cap, room)
        return max(0, cap)

    def on_admit(self, n: int = 1) -> None:
        """``n`` groups were admitted (they are now running, ``group_size`` samples each generating)."""
        self.running += n
        self.generating += n * self.group_size

    def on_generating(self, delta: int) -> None:
        """``delta`` samples of running groups started (a retry) or ended (``EpisodeSamples``)."""
        if self.generating + delta < 0:
            raise RuntimeError(f"StalenessGate.generating would go negative ({self.generating} + {delta})")
        self.generating += delta

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
        self.generating = 0


class EpisodeSamples:
    """One running group's share of ``StalenessGate.generating``.

    ``on_admit`` counted its ``group_size`` samples. Each attempt (a retry regenerates every sample)
    gets a fresh callback from ``attempt()`` that takes one sample off per distinct index;
    callbacks of an earlier attempt are ignored. ``close()`` takes off what is still counted when
    the episode ends, whatever the way (done, failed, cancelled). ``on_change`` runs after every
    sample that ends (the controller wakes admission with it)."""

    def __init__(self, gate: StalenessGate, on_change: Callable[[], None] | None = None) -> None:
        self.gate = gate
        self.on_change = on_change
        self.left = gate.group_size  # this group's samples counted in gate.generating
        self._attempt = 0

    def attempt(self) -> Callable[[int], None]:
        """Start an attempt: every sample generating again; returns its ``on_sample_done``."""
        self._attempt += 1
        this, seen = self._attempt, set()
        self.gate.on_generating(self.gate.group_size - self.left)
        self.left = self.gate.group_size

        def done(index: int) -> None:
            if this != self._attempt or index in seen or self.left <= 0:
                return
            seen.add(index)
            self.left -= 1
            self.gate.on_generating(-1)
            if self.on_change is not None:
                self.on_change()

        return done

    def close(self) -> None:
        """The episode ended: none of its samples generates any more."""
        self._attempt += 1
        self.gate.on_generating(-self.left)
        self.left = 0
