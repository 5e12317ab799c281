"""The weight versions ``LocalEngine`` serves at once: its base weights plus a table of LoRA adapter versions.

Owns ``VersionTable``, the engine thread's record of what it can serve. After a full update it holds one
version (the base weights); each adapter-only update (``WeightUpdate.adapter``) adds a version, the base
plus that adapter, which new requests take. Every request is pinned at intake (when the engine takes it
in) to the current version, or to the held version it names (``LocalEngine.generate(version=...)``), and
keeps it to its end: an adapter update interrupts nothing, so samples in flight finish on the version they
started with while new requests take the new one, and one decode step mixes them (``lora_rows``: which
rows of the step take which adapter; the forward adds each version's low-rank delta to its own rows).
The scheduler stamps every token with its request's version, so per-token versions and the staleness bound
stay exact. A version is dropped once no request uses it and it is not among the newest ``keep``. A full
update drops every version and moves the requests still waiting or running to the new weights.
"""

from __future__ import annotations

from typing import Any

import torch

from asyncrl.rollout.adapters import Adapter, HeldWeights, LoraRows, StackCache, VersionNotHeld, prepare_adapter
from asyncrl.rollout.requests import Request, post
from asyncrl.rollout.scheduler import Scheduler, StepPlan
from asyncrl.types import WeightUpdate

__all__ = ["VersionTable"]


class VersionTable:
    """The versions held now, oldest first, the last the current one (module docstring)."""

    def __init__(self, version: int, keep: int, scheduler: Scheduler, device: torch.device) -> None:
        if keep < 1:
            raise ValueError(f"keep_versions must be >= 1, got {keep}")
        self.keep, self.scheduler, self.device = keep, scheduler, device
        self.held: tuple[HeldWeights, ...] = (HeldWeights(int(version), None),)
        """Replaced whole (other threads read ``versions``)."""
        self.dropped = 0
        """Versions dropped since the start (adapter versions no request used any more)."""
        self.adapter_updates = 0
        self._rows_cache: tuple[int, LoraRows | None] | None = None  # (scheduler revision, a decode-only step's)
        self._stacks = StackCache()  # mixed-version steps' stacked factors

    @property
    def versions(self) -> tuple[int, ...]:
        return tuple(h.version for h in self.held)

    def stats(self) -> dict[str, float]:
        """``held_versions`` now, ``versions_dropped`` and ``adapter_updates`` since the start."""
        return {
            "held_versions": float(len(self.held)),
            "versions_dropped": float(self.dropped),
            "adapter_updates": float(self.adapter_updates),
        }

    def find(self, version: int) -> HeldWeights | None:
        """The newest held publication of ``version``."""
        return next((h for h in reversed(self.held) if h.version == version), None)

    def pin(self, requests: list[Request]) -> list[Request]:
        """Pin each arriving request to its weights (the current version, or the held one it names); those
        naming a version not held fail with ``VersionNotHeld``. Returns the pinned ones."""
        pinned = []
        for request in requests:
            weights = self.held[-1] if request.version is None else self.find(request.version)
            if weights is None:
                error = VersionNotHeld(f"version {request.version} is not held by this engine (held: {self.versions})")
                post(request.loop, request.future, None, error)
                continue
            request.weights = weights
            pinned.append(request)
        return pinned

    def add_adapter(self, model: Any, update: WeightUpdate, dtype: torch.dtype) -> None:
        """An adapter-only update: a new current version over the base weights (checked before anything
        changes); nothing running is touched."""
        assert update.adapter is not None
        adapter = prepare_adapter(model, update.adapter, dtype=dtype, device=self.device)
        self.held = (*self.held, HeldWeights(int(update.version), adapter))
        self._stacks.clear()
        self.adapter_updates += 1
        self.drop_unused()

    def replace(self, version: int) -> None:
        """A full update: the new weights are the only version, and the requests still waiting or running go
        on with them."""
        base = HeldWeights(int(version), None)
        self.held, self._rows_cache = (base,), None
        self._stacks.clear()
        for request in self.scheduler.requests():
            request.weights = base

    def drop_unused(self) -> None:
        """Forget the versions no request waiting or running uses that are not among the newest ``keep``."""
        held = self.held
        if len(held) <= self.keep:
            return
        used = {id(r.weights) for r in self.scheduler.requests()}
        first_kept = len(held) - self.keep
        kept = tuple(h for i, h in enumerate(held) if i >= first_kept or id(h) in used)
        if len(kept) < len(held):
            self.dropped += len(held) - len(kept)
            self.held = kept
            self._stacks.clear()

    def lora_rows(self, plan: StepPlan) -> LoraRows | None:
        """Which rows of the step take which adapter (None: every row runs on the base weights). One adapter
        for every sample of the step (the common case) applies to all rows, idle ones included. A decode-only
        step's answer is kept until the scheduler's ``revision`` changes."""
        if all(h.adapter is None for h in self.held):
            return None
        decode_only, revision = not plan.prefills, self.scheduler.revision
        if decode_only and self._rows_cache is not None and self._rows_cache[0] == revision:
            return self._rows_cache[1]

        def adapter(request: Request) -> Adapter | None:
            return None if request.weights is None else request.weights.adapter

        rows = [None if s is None else adapter(s.request) for s in plan.decode_samples]
        on_base = any(s is not None and a is None for s, a in zip(plan.decode_samples, rows, strict=True))
        for prefill in plan.prefills:
            a = adapter(prefill.request)
            rows += [a] * len(prefill.prefill_ids)
            on_base |= a is None
        distinct = {id(a): a for a in rows if a is not None}
        if not distinct:
            lora = None
        elif len(distinct) == 1 and not on_base:
            lora = LoraRows.every_row(next(iter(distinct.values())))
        else:
            lora = LoraRows.build(rows, self.device, self._stacks)
        if decode_only:
            self._rows_cache = (revision, lora)
        return lora
