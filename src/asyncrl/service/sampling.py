"""The engines behind the Tinker service's sampling: versioned weights in flight, snapshots on disk.

Owns :class:`EnginePool`. Each trained model has one *live* engine (the project's
:class:`~asyncrl.rollout.engine.LocalEngine`, started once, on the base model's weights):
``save_weights_for_sampler`` hands it the model's current version as an in-process
:class:`~asyncrl.types.WeightUpdate`, between two decode steps, without restarting it. A sampling
session is bound to one sampler checkpoint (a version); while the live engine holds that version, its
samples run there, pinned to it (``LocalEngine.generate(version=...)``), so every sample is decoded
wholly by the version its session names.

- A LoRA model's update is its adapters alone (``WeightUpdate.adapter``): the live engine adds the
  version to the ones it holds at once, without waiting for anything; samples in flight finish on their
  own version while new sessions' samples run on the new one, in the same batches. The engine keeps the
  newest ``EngineSpec.keep_versions`` versions loaded (older ones until their last sample ends).
- A fully fine-tuned model's update is the whole weights: it waits until the samples running on the
  live engine have finished (and holds new ones back meanwhile); the engine then holds that version only.

A session of a version the live engine no longer holds (or of a named checkpoint from before a restart,
or of a base model) is served by a *snapshot* engine loaded from the checkpoint's directory; the pool
keeps ``max_snapshots`` of them, the least recently used closed first.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.models import load_policy, stop_token_ids
from asyncrl.rollout.adapters import VersionNotHeld
from asyncrl.rollout.engine import LocalEngine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Completion, WeightUpdate

__all__ = ["EnginePool", "EngineSpec", "SamplerTarget"]


@dataclass(frozen=True)
class EngineSpec:
    """How every engine of the pool is sized."""

    max_slots: int = 16
    max_seq_len: int = 1024
    device: str = "cpu"
    keep_versions: int = 4
    """A live engine keeps this many newest adapter versions loaded when no sample uses them."""


@dataclass(frozen=True)
class SamplerTarget:
    """What a sampling session samples from: a directory of weights, its version, and the trained
    model whose live engine may hold that version (None for a base model)."""

    directory: str
    version: int
    run_id: str | None = None


class _Slot:
    """One engine, with readers (samples running) and a writer (a weight update) kept apart."""

    def __init__(self, engine: LocalEngine, tokenizer: Any, stops: tuple[int, ...]) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.stops = stops
        self.readers = 0
        self.updating = False
        self.cond = asyncio.Condition()

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[None]:
        async with self.cond:
            await self.cond.wait_for(lambda: not self.updating)
            self.readers += 1
        try:
            yield
        finally:
            async with self.cond:
                self.readers -= 1
                self.cond.notify_all()

    async def update(self, update: WeightUpdate) -> None:
        """A full update waits for the running samples to finish (and holds new ones back); an adapter
        update goes to the engine at once (the samples running keep their own version)."""
        if update.adapter is not None:
            async with self.cond:
                await self.cond.wait_for(lambda: not self.updating)
            await self.engine.update_weights(update)
            return
        async with self.cond:
            await self.cond.wait_for(lambda: not self.updating)
            self.updating = True
            await self.cond.wait_for(lambda: self.readers == 0)
        try:
            await self.engine.update_weights(update)
        finally:
            async with self.cond:
                self.updating = False
                self.cond.notify_all()


class EnginePool:
    """Live engines (one per trained model) and snapshot engines (see the module docstring)."""

    def __init__(self, spec: EngineSpec, *, max_snapshots: int = 2) -> None:
        self.spec = spec
        self.max_snapshots = max_snapshots
        self._live: dict[str, _Slot] = {}
        self._snapshots: OrderedDict[str, _Slot] = OrderedDict()
        self._scorers: OrderedDict[str, Any] = OrderedDict()
        self._lock = asyncio.Lock()

    async def prompt_logprobs(self, target: SamplerTarget, prompt: Sequence[int], last_n: int | None) -> list[float]:
        """Each prompt token's log-prob given the tokens before it, under the target's weights (a forward
        of a model loaded from the target's directory, kept for the next call); NaN where not scored
        (the first position, and all but the last ``last_n``)."""
        async with self._lock:
            model = self._scorers.get(target.directory)
            if model is None:
                loaded = await asyncio.to_thread(load_policy, target.directory, device=self.spec.device)
                model = self._scorers[target.directory] = loaded[0]
                while len(self._scorers) > self.max_snapshots:
                    self._scorers.popitem(last=False)
            self._scorers.move_to_end(target.directory)

        def score() -> list[float]:
            import torch

            ids = torch.tensor([list(prompt)], dtype=torch.long, device=self.spec.device)
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
            scored = logp.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1).tolist()
            first = len(prompt) - last_n if last_n is not None else 1
            return [math.nan if i < first else scored[i - 1] for i in range(len(prompt))]

        return await asyncio.to_thread(score)

    async def _build(self, directory: str | Path, version: int, keep_versions: int = 1) -> _Slot:
        def build() -> _Slot:
            model, tokenizer = load_policy(directory, device=self.spec.device)
            engine = LocalEngine(
                model,
                tokenizer,
                max_slots=self.spec.max_slots,
                max_seq_len=self.spec.max_seq_len,
                interrupt_mode="abort",
                device=self.spec.device,
                version=version,
                keep_versions=keep_versions,
            )
            engine.start()
            return _Slot(engine, tokenizer, stop_token_ids(tokenizer, model))

        return await asyncio.to_thread(build)

    async def publish(self, run_id: str, base_dir: str | Path, update: WeightUpdate) -> None:
        """Hand a trained model's new version to its live engine (built on first use)."""
        async with self._lock:
            slot = self._live.get(run_id)
            if slot is None:
                slot = self._live[run_id] = await self._build(base_dir, 0, self.spec.keep_versions)
        await slot.update(update)

    def live_version(self, run_id: str) -> int | None:
        """The version new samples of the model's live engine run on (None: no live engine yet)."""
        slot = self._live.get(run_id)
        return None if slot is None else slot.engine.version

    def live_versions(self, run_id: str) -> tuple[int, ...]:
        """Every version the model's live engine holds now, oldest first."""
        slot = self._live.get(run_id)
        return () if slot is None else slot.engine.versions

    def live_stats(self, run_id: str) -> dict[str, float]:
        """The counters of the model's live engine (``LocalEngine.stats``; empty: no live engine yet)."""
        slot = self._live.get(run_id)
        return {} if slot is None else slot.engine.stats()

    async def _slot_for(self, target: SamplerTarget) -> _Slot:
        live = self._live.get(target.run_id) if target.run_id is not None else None
        if live is not None and target.version in live.engine.versions and not live.updating:
            return live
        async with self._lock:
            slot = self._snapshots.get(target.directory)
            if slot is None:
                slot = self._snapshots[target.directory] = await self._build(target.directory, target.version)
                while len(self._snapshots) > self.max_snapshots:
                    _, old = self._snapshots.popitem(last=False)
                    await asyncio.to_thread(old.engine.close)
            self._snapshots.move_to_end(target.directory)
            return slot

    async def sample(
        self, target: SamplerTarget, prompt: Sequence[int], params: dict[str, Any], n: int, stop: Any
    ) -> list[Completion]:
        """``n`` samples of ``prompt`` from the target's weights (``params``: max_tokens, temperature,
        top_k, top_p, seed as the client names them; ``stop``: the client's ``stop``)."""
        slot = await self._slot_for(target)
        room = slot.engine.max_seq_len - len(prompt)
        if room < 1:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens; this service's context is {slot.engine.max_seq_len}"
            )
        max_new = min(int(params.get("max_tokens") or room), room)
        top_k = int(params.get("top_k", -1))
        seed = params.get("seed")
        sampling = [
            SamplingParams(
                max_new_tokens=max_new,
                temperature=float(params.get("temperature", 1.0)),
                top_p=float(params.get("top_p", 1.0)),
                top_k=max(top_k, 0),
                stop_token_ids=self._stops(slot, stop),
                seed=None if seed is None else int(seed) + start,
            )
            for start in range(0, n, slot.engine.max_slots)
        ]
        async with slot.reading():
            if target.version in slot.engine.versions:
                sizes = [min(slot.engine.max_slots, n - i * slot.engine.max_slots) for i in range(len(sampling))]
                calls = [
                    slot.engine.generate(prompt, params_i, n=size, version=target.version)
                    for params_i, size in zip(sampling, sizes, strict=True)
                ]
                groups = await asyncio.gather(*calls, return_exceptions=True)  # submitted, so pinned, together
                failed = [g for g in groups if isinstance(g, BaseException)]
                if not failed:
                    return [c for group in groups for c in group]  # type: ignore[union-attr]
                if not all(isinstance(g, VersionNotHeld) for g in failed):
                    raise next(g for g in failed if not isinstance(g, VersionNotHeld))
        # the live engine no longer holds the version: the target's own weights are on disk (a snapshot engine)
        return await self.sample(SamplerTarget(target.directory, target.version), prompt, params, n, stop)

    @staticmethod
    def _stops(slot: _Slot, stop: Any) -> tuple[int, ...]:
        """The client's ``stop`` as token ids: None = EOS, ``[]`` = none, ids, or strings of one token."""
        if stop is None:
            return slot.stops
        items = [stop] if isinstance(stop, str) else list(stop)
        ids = []
        for item in items:
            if isinstance(item, bool) or not isinstance(item, int | str):
                raise ValueError(f"sampling_params.stop: {item!r} is neither a token id nor a string")
            if isinstance(item, str):
                encoded = slot.tokenizer.encode(item, add_special_tokens=False)
                if len(encoded) != 1:
                    raise ValueError(
                        f"sampling_params.stop: the stop string {item!r} is {len(encoded)} tokens here; only "
                        "single-token stop strings (or token ids) are supported"
                    )
                item = encoded[0]
            ids.append(int(item))
        return tuple(ids)

    async def close(self) -> None:
        slots = list(self._live.values()) + list(self._snapshots.values())
        self._live.clear()
        self._snapshots.clear()
        for slot in slots:
            await asyncio.to_thread(slot.engine.close)
