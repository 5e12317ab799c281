"""Driver-side clients of the Ray actors, behind the protocols the controller uses.

- ``RayEngineClient``: one ``EngineWorker`` actor as a ``rollout.api.RolloutEngine`` (it answers a
  group at once: ``reports_each_sample`` is False). A call that
  fails because the actor's process is gone raises ``rollout.pool.EngineDied``, which tells the
  ``EnginePool`` to restart the engine and send the request again. ``stats()`` must not block the
  event loop: it returns the newest counters received and asks for fresh ones in the background
  (the controller's timeline sampler calls it four times a second, so they are at most ~0.25 s old).
- ``ServedEngineClient``: a ``RemoteEngine`` of an engine actor's HTTP server
  (``launch.engine_mode=server``), sending the run's API key; a failed request whose actor is dead
  raises ``EngineDied``.
- ``RayTrainerGroup``: the M ``TrainerRank`` actors as a ``trainer.api.PolicyTrainer``: every call
  goes to every rank (SPMD) and rank 0's answer is returned. When a rank dies, the others would
  wait in a collective until the process-group timeout; the group instead notices the death at
  once, kills every rank and raises ``TrainerRankDied`` (the run stops; it resumes from its newest
  checkpoint). A rank whose call raises stops every rank the same way, with its own error.
- ``RayRewardPool``: K ``RewardWorker`` actors behind ``RewardService.score``; the least busy one
  scores; a dead worker is replaced and the item scored again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from asyncrl.choices import RayWeightSync, WeightTransport
from asyncrl.reward.service import RewardResult
from asyncrl.rollout.api import SampleDone, refuse_on_sample_done
from asyncrl.rollout.pool import EngineDied
from asyncrl.rollout.remote import RemoteEngine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.trainer.api import TrainStepResult
from asyncrl.types import Completion, TrainBatch, WeightUpdate

_DEAD = (RayActorError, ActorDiedError, ActorUnavailableError)


class TrainerRankDied(RuntimeError):
    """A trainer rank's process died: the run cannot continue (resume from a checkpoint)."""


class RayEngineClient:
    """One engine actor as a ``RolloutEngine`` (see the module docstring)."""

    reports_each_sample = False
    """The actor answers a group at once (``generate`` takes no ``on_sample_done``)."""

    def __init__(self, actor: Any, index: int) -> None:
        self.actor = actor
        self.index = index
        self._version = 0
        self._stats: dict[str, float] = {}
        self._pending: Any = None

    @property
    def version(self) -> int:
        return self._version

    def start(self) -> None:
        """The actor's engine runs already."""

    async def _call(self, method: str, *args: Any) -> Any:
        try:
            return await getattr(self.actor, method).remote(*args)
        except _DEAD as exc:
            raise EngineDied(f"engine actor {self.index} died during {method}: {type(exc).__name__}") from exc

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling: SamplingParams,
        n: int = 1,
        on_sample_done: SampleDone | None = None,
    ) -> list[Completion]:
        refuse_on_sample_done(self, on_sample_done)
        return await self._call("generate", [int(t) for t in input_ids], sampling, n)

    async def update_weights(self, update: WeightUpdate) -> None:
        version = await self._call("update_weights", update)
        if int(version) != int(update.version):
            raise RuntimeError(f"engine {self.index} is at version {version} after an update to {update.version}")
        self._version = int(version)

    async def pause(self) -> None:
        await self._call("pause")

    async def resume(self) -> None:
        await self._call("resume")

    async def abort_all(self) -> int:
        return int(await self._call("abort_all"))

    def stats(self) -> dict[str, float]:
        if self._pending is not None:
            ready, _ = ray.wait([self._pending], timeout=0)
            if ready:
                try:
                    self._stats = dict(ray.get(ready[0]))
                except _DEAD:
                    pass  # keep the last known counters of a dead engine
                self._pending = None
        if self._pending is None:
            self._pending = self.actor.stats.remote()
        return dict(self._stats)

    async def fetch_stats(self) -> dict[str, float]:
        """Fetch fresh counters (awaited; also fills the cache before the first ``stats()``)."""
        self._stats = dict(await self._call("stats"))
        return dict(self._stats)

    def refresh_stats(self, timeout_s: float = 30.0) -> dict[str, float]:
        """Fetch fresh counters now (blocking; outside the event loop or at the end of a run)."""
        try:
            self._stats = dict(ray.get(self.actor.stats.remote(), timeout=timeout_s))
        except _DEAD:
            pass  # keep the last known counters of a dead engine
        return dict(self._stats)

    async def fetch_engine_class(self, timeout_s: float = 30.0) -> str:
        """The class of the actor's engine (``LocalEngine``, ``VLLMEngine``); ``"dead"`` for an actor that is
        gone, ``"unresponsive"`` for one that does not answer within ``timeout_s``."""
        try:
            return str(await asyncio.wait_for(self.actor.engine_class.remote(), timeout_s))
        except _DEAD:
            return "dead"
        except TimeoutError:
            return "unresponsive"

    def close(self) -> None:
        ray.kill(self.actor, no_restart=True)


class ServedEngineClient(RemoteEngine):
    """``RemoteEngine`` of an engine actor's server; maps a dead actor to ``EngineDied``."""

    def __init__(self, url: str, actor: Any, index: int, api_key: str) -> None:
        super().__init__(url, api_key=api_key)
        self.actor = actor
        self.index = index

    async def _alive(self) -> bool:
        try:
            await asyncio.wait_for(self.actor.pid.remote(), timeout=10.0)
            return True
        except (*_DEAD, asyncio.TimeoutError):
            return False

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling: SamplingParams,
        n: int = 1,
        on_sample_done: SampleDone | None = None,
    ) -> list[Completion]:
        try:
            return await super().generate(input_ids, sampling, n, on_sample_done)
        except (RuntimeError, OSError) as exc:
            if not await self._alive():
                raise EngineDied(f"engine server {self.index} ({self.base_url}) died") from exc
            raise

    async def update_weights(self, update: WeightUpdate) -> None:
        try:
            await super().update_weights(update)
        except (RuntimeError, OSError) as exc:
            if not await self._alive():
                raise EngineDied(f"engine server {self.index} ({self.base_url}) died") from exc
            raise

    def close(self) -> None:
        super().close()
        ray.kill(self.actor, no_restart=True)


class RayTrainerGroup:
    """The trainer ranks as a ``PolicyTrainer`` (see the module docstring)."""

    def __init__(self, ranks: list[Any], transport: RayWeightSync, version: int) -> None:
        self.ranks = ranks
        self.transport = transport
        self.version = version
        self.skipped_steps = 0
        self.sync_bytes = 0

    def _all(self, method: str, *args: Any) -> Any:
        """Call ``method`` on every rank; rank 0's result. A rank's death stops every rank."""
        refs = [getattr(rank, method).remote(*args) for rank in self.ranks]
        pending = list(refs)
        results: dict[Any, Any] = {}
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                results[ready[0]] = ray.get(ready[0])
            except _DEAD as exc:
                rank = refs.index(ready[0])
                self.kill()
                raise TrainerRankDied(
                    f"trainer rank {rank} died during {method} ({type(exc).__name__}); every rank was stopped"
                ) from exc
            except Exception:  # a rank raised: the others may wait in a collective that never completes
                self.kill()
                raise
        return results[refs[0]]

    def train_step(self, batch: TrainBatch) -> TrainStepResult:
        result = self._all("train_step", ray.put(batch))
        self.version = result.version
        self.skipped_steps += 0 if result.applied else 1
        return result

    def export_weights(self, transport: WeightTransport | None = None) -> WeightUpdate:
        update = self._all("export", transport or self.transport)
        self.sync_bytes = int(getattr(update, "nbytes", 0))
        return update

    def save_checkpoint(
        self, directory: str | Path, extra: dict[str, Any] | None = None, tokenizer: Any = None
    ) -> None:
        """Rank 0 writes (with its own tokenizer); every rank takes part in the gathers."""
        self._all("save_checkpoint", str(directory), extra)

    def load_checkpoint(self, directory: str | Path) -> dict[str, Any] | None:
        extra, self.version = self._all("load_checkpoint", str(directory))
        return extra

    def save_pretrained(self, directory: str | Path, tokenizer: Any = None) -> None:
        self._all("save_pretrained", str(directory))

    def close(self) -> None:
        try:
            ray.get([rank.shutdown.remote() for rank in self.ranks], timeout=60)
        except Exception:  # noqa: BLE001 - a dead or stuck rank: killing it below is enough
            pass
        self.kill()

    def kill(self) -> None:
        for rank in self.ranks:
            ray.kill(rank, no_restart=True)


class RayRewardPool:
    """K reward-worker actors behind ``RewardService.score`` (see the module docstring)."""

    def __init__(self, make_worker: Callable[[int], Any], num_workers: int, max_replacements: int = 8) -> None:
        self._make = make_worker
        self.workers = [make_worker(i) for i in range(num_workers)]
        self._busy = [0] * num_workers
        self.replaced = 0
        self.max_replacements = max_replacements

    async def score(
        self, verifier: str, response: str, reference: str, *, prompt: str = "", row: dict | None = None
    ) -> RewardResult:
        t0 = time.monotonic()
        for _ in range(3):
            index = min(range(len(self.workers)), key=lambda i: (self._busy[i], i))
            worker = self.workers[index]
            self._busy[index] += 1
            try:
                reward, failure = await worker.score.remote(verifier, response, reference, prompt, dict(row or {}))
                return RewardResult(float(reward), failure, time.monotonic() - t0, False)
            except _DEAD:
                if self.workers[index] is worker:  # not replaced by another caller yet
                    if self.replaced >= self.max_replacements:
                        raise
                    self.workers[index] = self._make(index)
                    self.replaced += 1
            finally:
                self._busy[index] -= 1
        return RewardResult(0.0, "worker_died", time.monotonic() - t0, False)

    async def close(self) -> None:
        for worker in self.workers:
            try:
                await asyncio.wait_for(worker.close.remote(), timeout=10.0)
            except Exception:  # noqa: BLE001 - dead already
                pass
            ray.kill(worker, no_restart=True)
