"""The reward service: verifiers in an isolated process pool with hard timeouts.

Owns :class:`RewardService`, the async entry point the controller hands to workflows as their
``score`` callable, and :class:`RewardResult`. It chooses a verifier by one explicit ``match``
(:func:`resolve_verifier`), runs it in a pool of worker processes (started lazily with the
``spawn`` method, so nothing of the parent's torch threads is inherited), kills and replaces a
worker that exceeds the per-item deadline, retries only infrastructure failures (a dead worker, a
sandbox that could not start, a network error), never a verdict, caches verdicts by
(verifier, response, reference) and keeps metrics.

A verifier that hangs, crashes or raises never turns into a reward of 0: the result carries a
``failure`` reason ("timeout", "worker_died", "error: ..."), the event is counted in
:meth:`RewardService.metrics` and logged, and the caller marks the sample (``Group.reward_failures``).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from asyncrl.reward import InfrastructureError
from asyncrl.reward.client import RemoteRewardClient
from asyncrl.reward.judge import JudgeClient, JudgeTarget
from asyncrl.reward.verifiers import (  # noqa: F401
    RemoteTarget,
    Request,
    WorkerFn,
    _score_code,
    _score_reasoning_gym,
    resolve_verifier,
)
from asyncrl.reward.worker import _LeaderGone, _recv, _Worker  # noqa: F401

if TYPE_CHECKING:
    from asyncrl.reward.code import SandboxLimits

logger = logging.getLogger(__name__)

CODE_GRACE_S = 5.0
"""Extra time a code item gets over the sandbox's own limit (interpreter start, cleanup), so that
a program that times out is a verdict of the sandbox, not a killed worker."""


@dataclass(frozen=True)
class RewardResult:
    """Outcome of scoring one response."""

    reward: float
    """The verifier's reward (0.0 when ``failure`` is set: not a verdict, do not train on it)."""
    failure: str | None
    """None when the verifier reached a verdict; else "timeout", "worker_died" or "error: ..."."""
    latency_s: float
    """Wall time of this call (queueing included)."""
    cached: bool
    """The verdict came from the cache (or from an identical request in flight)."""


@runtime_checkable
class RewardScorer(Protocol):
    """What a workflow's ``score`` callable needs of a reward service: ``RewardService`` (local
    processes) and ``launch.ray_clients.RayRewardPool`` (Ray actors) both are one."""

    async def score(
        self, verifier: str, response: str, reference: str, *, prompt: str = "", row: dict | None = None
    ) -> RewardResult:
        """The verdict of ``verifier`` on ``response`` against ``reference`` (a failure is a reason, never a 0)."""
        ...


@dataclass
class _Stats:
    requests: int = 0
    verdicts: int = 0
    failures: int = 0
    cache_hits: int = 0
    timeouts: int = 0
    errors: int = 0
    worker_deaths: int = 0
    retries: int = 0
    workers_started: int = 0
    workers_killed: int = 0
    notes: collections.Counter[str] = field(default_factory=collections.Counter)
    latencies: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=10_000))


class RewardService:
    """Scores responses with a verifier in a pool of worker processes.

    ``timeout_s`` is the hard per-item deadline once a worker has the item (queueing excluded);
    ``code`` items get ``code_timeout_s`` (default ``timeout_s``) inside the sandbox plus
    :data:`CODE_GRACE_S`; math-verify gets a soft timeout a little below ``timeout_s`` so a slow
    check usually ends without killing the worker. ``max_retries`` applies to infrastructure
    failures only. Usable as ``async with RewardService() as svc: ...``; all methods must be called
    from one event loop.
    """

    def __init__(
        self,
        num_workers: int = 2,
        timeout_s: float = 10.0,
        max_retries: int = 2,
        cache_size: int = 100_000,
        *,
        code_timeout_s: float | None = None,
        code_limits: SandboxLimits | None = None,
        remote_timeout_s: float | None = None,
        preload: tuple[str, ...] = ("math",),
        startup_timeout_s: float = 120.0,
    ) -> None:
        if num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self.max_retries = max(0, int(max_retries))
        self.cache_size = max(0, int(cache_size))
        self.code_timeout_s = float(code_timeout_s if code_timeout_s is not None else timeout_s)
        self.code_limits = code_limits
        self.remote_timeout_s = float(
            remote_timeout_s if remote_timeout_s is not None else self.code_timeout_s + CODE_GRACE_S + 5.0
        )
        self.math_timeout_s = max(self.timeout_s - 1.0, self.timeout_s * 0.8)
        self.startup_timeout_s = startup_timeout_s
        self._preload = tuple(preload)
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._slots = 0  # workers alive or starting
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._cache: collections.OrderedDict[bytes, float] = collections.OrderedDict()
        self._inflight: dict[bytes, asyncio.Future[RewardResult]] = {}
        self._clients: dict[str, Any] = {}
        self._stats = _Stats()
        self._closed = False

    # -------------------------------------------------------------------------------- public API

    async def score(
        self, verifier: str, response: str, reference: str, *, prompt: str = "", row: dict | None = None
    ) -> RewardResult:
        """Score ``response`` against ``reference`` with ``verifier`` (see :func:`resolve_verifier`).

        Never raises for a verifier's problem (the result's ``failure`` says what went wrong);
        raises ValueError for an unknown verifier and RuntimeError after :meth:`close`.
        """
        if self._closed:
            raise RuntimeError("RewardService is closed")
        start = time.monotonic()
        target = resolve_verifier(verifier)
        self._stats.requests += 1
        key = self._key(verifier, response, reference, prompt, row, target)
        while True:
            if key in self._cache:
                self._cache.move_to_end(key)
                self._stats.cache_hits += 1
                return self._finish(RewardResult(self._cache[key], None, 0.0, True), start)
            leader = self._inflight.get(key)
            if leader is None:
                break
            try:
                shared = await asyncio.shield(leader)
            except _LeaderGone:
                continue
            if shared.failure is None:
                self._stats.cache_hits += 1
                return self._finish(replace(shared, cached=True), start)
            # same input, same failure: the leader already retried what was retryable, and
            # repeating a hang for every copy of a response would multiply the wait
            return self._finish(shared, start)
        mine: asyncio.Future[RewardResult] = asyncio.get_running_loop().create_future()
        self._inflight[key] = mine
        try:
            req = Request(
                response=response,
                reference=reference,
                prompt=prompt,
                row=row,
                math_timeout_s=self.math_timeout_s,
                code_timeout_s=self.code_timeout_s,
                code_limits=self.code_limits,
            )
            result = await self._score_uncached(verifier, target, req)
            if result.failure is None and self.cache_size:
                self._cache[key] = result.reward
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
            mine.set_result(result)
        except BaseException:
            mine.set_exception(_LeaderGone())
            mine.exception()  # retrieved: no "never retrieved" warning when nobody waited
            raise
        finally:
            if self._inflight.get(key) is mine:
                del self._inflight[key]
        return self._finish(result, start)

    def metrics(self) -> dict[str, float]:
        """Counters and latency percentiles (seconds, over the last 10,000 scored requests)."""
        s = self._stats
        lat = sorted(s.latencies)

        def pct(q: float) -> float:
            return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else 0.0

        out = {
            "requests": float(s.requests),
            "verdicts": float(s.verdicts),
            "failures": float(s.failures),
            "cache_hits": float(s.cache_hits),
            "cache_hit_rate": s.cache_hits / s.requests if s.requests else 0.0,
            "cache_size": float(len(self._cache)),
            "timeouts": float(s.timeouts),
            "errors": float(s.errors),
            "worker_deaths": float(s.worker_deaths),
            "retries": float(s.retries),
            "workers_started": float(s.workers_started),
            "workers_killed": float(s.workers_killed),
            "workers_alive": float(len(self._idle) + len(self._busy)),
            "workers_busy": float(len(self._busy)),
            "queue_waiting": float(len(self._waiters)),
            "latency_p50_s": pct(0.50),
            "latency_p90_s": pct(0.90),
            "latency_p99_s": pct(0.99),
            "latency_max_s": lat[-1] if lat else 0.0,
            "latency_mean_s": sum(lat) / len(lat) if lat else 0.0,
        }
        for note, n in sorted(s.notes.items()):
            out[f"code_{note}"] = float(n)
        return out

    async def close(self) -> None:
        """Stop all workers (idle ones cleanly, busy ones killed). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for fut in self._waiters:
            if not fut.done():
                fut.set_exception(RuntimeError("RewardService is closed"))
                fut.exception()
        self._waiters.clear()
        workers = list(self._idle) + list(self._busy)
        self._idle.clear()
        self._busy.clear()
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, w.stop) for w in workers))
        for client in self._clients.values():
            await client.close()
        self._clients.clear()

    async def __aenter__(self) -> RewardService:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -------------------------------------------------------------------------------- internals

    def _finish(self, result: RewardResult, start: float) -> RewardResult:
        latency = time.monotonic() - start
        self._stats.latencies.append(latency)
        if result.failure is None:
            self._stats.verdicts += 1
        else:
            self._stats.failures += 1
        return replace(result, latency_s=latency)

    @staticmethod
    def _key(verifier: str, response: str, reference: str, prompt: str, row: dict | None, target: object) -> bytes:
        h = hashlib.blake2b(digest_size=20)
        parts = [verifier, response, reference]
        if isinstance(target, (RemoteTarget, JudgeTarget, functools.partial)):
            # custom, remote and judge verifiers may read the prompt (and the row) as well
            parts += [prompt, json.dumps(row, sort_keys=True, default=str)]
        elif target is _score_code and row and row.get("entry_point"):
            # the code verifier builds the program from the row's prompt and entry point
            parts += [str(row.get("entry_point")), str(row.get("prompt", ""))]
        elif target is _score_reasoning_gym:
            # the dataset scores against the whole entry (a puzzle has many right answers)
            parts += [json.dumps((row or {}).get("reasoning_gym_entry"), sort_keys=True, default=str)]
        for part in parts:
            data = part.encode("utf-8", "surrogatepass")
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)
        return h.digest()

    async def _score_uncached(
        self, verifier: str, target: WorkerFn | RemoteTarget | JudgeTarget, req: Request
    ) -> RewardResult:
        attempt = 0
        while True:
            if isinstance(target, RemoteTarget):
                outcome = await self._run_remote(target, req)
            elif isinstance(target, JudgeTarget):
                outcome = await self._run_judge(target, req)
            else:
                deadline = self.code_timeout_s + CODE_GRACE_S if target is _score_code else self.timeout_s
                outcome = await self._run_in_worker(target, req, deadline)
            kind = outcome[0]
            if kind == "ok":
                if outcome[2]:
                    self._stats.notes[outcome[2]] += 1
                return RewardResult(outcome[1], None, 0.0, False)
            if kind in ("died", "infra") and attempt < self.max_retries and not self._closed:
                attempt += 1
                self._stats.retries += 1
                logger.warning("reward %s: %s; retry %d/%d", verifier, outcome[1], attempt, self.max_retries)
                continue
            failure = {"timeout": "timeout", "died": "worker_died"}.get(kind, f"error: {outcome[1]}")
            if kind == "timeout":
                self._stats.timeouts += 1
            elif kind != "died":
                self._stats.errors += 1
            logger.warning(
                "reward %s failed (%s) after %d attempt(s); the sample is marked, not scored 0: %s",
                verifier,
                failure,
                attempt + 1,
                outcome[1],
            )
            return RewardResult(0.0, failure, 0.0, False)

    async def _run_remote(self, target: RemoteTarget, req: Request) -> tuple[Any, ...]:
        client = self._clients.get(target.url)
        if client is None:
            client = self._clients[target.url] = RemoteRewardClient(target.url, timeout_s=self.remote_timeout_s)
        try:
            reward, failure = await asyncio.wait_for(
                client.score(req.response, req.reference, prompt=req.prompt, row=req.row),
                self.remote_timeout_s,
            )
        except asyncio.TimeoutError:
            return (
                "timeout",
                f"remote verifier at {target.url} did not answer in {self.remote_timeout_s:g}s",
            )
        except InfrastructureError as e:
            return ("infra", str(e))
        except Exception as e:  # noqa: BLE001
            return ("error", f"{type(e).__name__}: {e}")
        if failure is None:
            return ("ok", reward, "")
        if failure == "timeout":
            return ("timeout", f"remote: {failure}")
        if failure == "worker_died":
            return ("died", f"remote: {failure}")
        return ("error", f"remote: {failure.removeprefix('error: ')}")

    async def _run_judge(self, target: JudgeTarget, req: Request) -> tuple[Any, ...]:
        """One verdict of an LLM judge (``reward.judge``): its timeout, retryable and final failures mapped
        like a remote verifier's."""
        client = self._clients.get(f"judge:{target}")
        if client is None:
            client = self._clients[f"judge:{target}"] = JudgeClient(target, timeout_s=self.remote_timeout_s)
        try:
            verdict = client.judge(req.prompt, req.response, req.reference)
            reward = await asyncio.wait_for(verdict, self.remote_timeout_s)
        except asyncio.TimeoutError:
            return ("timeout", f"judge at {target.url} did not answer in {self.remote_timeout_s:g}s")
        except InfrastructureError as e:
            return ("infra", str(e))
        except Exception as e:  # noqa: BLE001  (a refusal, a reply without a verdict: not a 0)
            return ("error", f"judge: {type(e).__name__}: {e}")
        return ("ok", reward, "")

    async def _run_in_worker(self, fn: WorkerFn, req: Request, deadline: float) -> tuple[Any, ...]:
        try:
            worker = await self._acquire()
        except InfrastructureError as e:
            return ("infra", str(e))
        try:
            worker.conn.send((fn, req))
            reply = await _recv(worker.conn, deadline)
        except asyncio.TimeoutError:
            self._discard(worker, "timeout")
            return ("timeout", f"no verdict within {deadline:g}s; worker killed and replaced")
        except (EOFError, OSError) as e:
            code = worker.wait_exit(0.5)
            self._discard(worker, "died")
            return ("died", f"worker process died (exit code {code}, {type(e).__name__})")
        except BaseException:
            self._discard(worker, "cancelled")  # it is mid-request: its reply would be misread later
            raise
        self._release(worker)
        return reply

    async def _acquire(self) -> _Worker:
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise RuntimeError("RewardService is closed")
            if self._idle:
                worker = self._idle.pop()
                self._busy.add(worker)
                return worker
            if self._slots < self.num_workers:
                self._slots += 1
                try:
                    worker = await self._start_worker(loop)
                except BaseException:
                    self._slots -= 1
                    self._wake_one()
                    raise
                self._busy.add(worker)
                return worker
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    self._wake_one()  # we were woken but leave: pass the turn on
                raise

    async def _start_worker(self, loop: asyncio.AbstractEventLoop) -> _Worker:
        worker = _Worker(self._preload)
        try:
            await loop.run_in_executor(None, worker.start)
            hello = await _recv(worker.conn, self.startup_timeout_s)
        except BaseException as e:
            await loop.run_in_executor(None, worker.kill)
            if isinstance(e, (asyncio.TimeoutError, EOFError, OSError)):
                raise InfrastructureError(f"reward worker failed to start: {type(e).__name__}: {e}") from e
            raise
        if not (isinstance(hello, tuple) and hello and hello[0] == "ready"):
            await loop.run_in_executor(None, worker.kill)
            raise InfrastructureError(f"reward worker sent {hello!r} instead of ready")
        self._stats.workers_started += 1
        return worker

    def _release(self, worker: _Worker) -> None:
        self._busy.discard(worker)
        if self._closed:
            worker.kill()
            return
        self._idle.append(worker)
        self._wake_one()

    def _discard(self, worker: _Worker, why: str) -> None:
        """Kill a worker (hung, dead or abandoned mid-request) and free its slot for a new one."""
        self._busy.discard(worker)
        if why == "died":
            self._stats.worker_deaths += 1
        else:
            self._stats.workers_killed += 1
        worker.kill()
        self._slots -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
