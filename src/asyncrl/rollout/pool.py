"""``EnginePool``: several engines behind one engine interface, requests spread by load.

Owns routing and engine replacement. A pool is a ``rollout.api.RolloutEngine`` over members that
are ``RolloutEngine``s too (``LocalEngine``, ``RemoteEngine`` or a Ray engine actor's client): the
controller talks to it exactly as to one engine. It answers a group at once
(``reports_each_sample`` is False), whatever its members do.

- Routing: a ``generate`` call goes to the live member with the fewest tokens in flight, where a
  request counts ``n x (prompt length + max_new_tokens)`` until it returns (the G samples of one
  prompt stay on one engine and share its prefill). Ties go to the lower index.
- Weight updates go to every member concurrently; the pool keeps the last update so that a
  replaced member is brought to the current version before it takes requests.
- Failure: when a member raises ``EngineDied`` (its process is gone), the pool takes it out of
  routing, sends the failed request again at once to the least-loaded live member
  (``redispatched_requests``), and restarts the dead one in the background through the
  ``restart`` callback (at most ``max_restarts`` times per member; past that, or without a
  callback, it is retired). A replacement gets the newest weights before it takes requests. The
  re-run starts from the request's prompt (which, for a resumed interrupted sample, includes its
  earlier chunks), so nothing is lost and the controller sees one completed request. With no live
  member, requests wait for a restart; when none can come, they raise ``EngineDied``. Other
  exceptions (bad input) propagate unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from asyncrl.rollout.api import RolloutEngine, SampleDone, refuse_on_sample_done
from asyncrl.rollout.engine_counters import COUNTER_NAMES
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Completion, WeightUpdate

__all__ = ["EngineDied", "EnginePool"]

_CUMULATIVE = frozenset((*COUNTER_NAMES, "running_sample_s"))
"""Counters that only grow (the engine's ``COUNTER_NAMES`` and its running-sample integral): a replaced engine's
last values stay in the pool's sums."""

RestartFn = Callable[[int], Awaitable[RolloutEngine]]
"""``restart(index) -> new engine`` (awaited); the pool then loads the last weights into it."""


class EngineDied(RuntimeError):
    """An engine's process is gone (raised by engine clients; the pool restarts the engine)."""


@dataclass
class _Member:
    engine: RolloutEngine
    inflight_tokens: int = 0
    restarts: int = 0
    generation: int = 0  # bumps at every replacement (a stale failure report is ignored)
    alive: bool = True


class EnginePool:
    """Engines behind one interface (see module docstring)."""

    def __init__(
        self, engines: Sequence[RolloutEngine], *, restart: RestartFn | None = None, max_restarts: int = 3
    ) -> None:
        if not engines:
            raise ValueError("EnginePool needs at least one engine")
        self._members = [_Member(e) for e in engines]
        self._restart = restart
        self.max_restarts = max_restarts
        self._last_update: WeightUpdate | None = None
        self._restarting: dict[int, asyncio.Task] = {}
        self._changed: asyncio.Event | None = None  # set when a member comes back or is retired
        self._counters = {"redispatched_requests": 0.0, "engine_deaths": 0.0, "engine_restarts": 0.0}
        self._retired: dict[str, float] = {}  # cumulative counters of replaced engines
        self.restart_errors: list[str] = []
        self._version = min(int(e.version) for e in engines)

    # ------------------------------------------------------------------ engine interface
    @property
    def version(self) -> int:
        """The version of the last update every engine has taken."""
        return self._version

    reports_each_sample = False
    """A pool answers a group at once (``generate`` takes no ``on_sample_done``)."""

    @property
    def engines(self) -> list[RolloutEngine]:
        """The current members (replacements included), in routing order."""
        return [m.engine for m in self._members]

    def start(self) -> None:
        for m in self._members:
            m.engine.start()

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling: SamplingParams,
        n: int = 1,
        on_sample_done: SampleDone | None = None,
    ) -> list[Completion]:
        """``n`` samples of one prompt from the least-loaded engine (re-sent if that engine dies)."""
        refuse_on_sample_done(self, on_sample_done)
        cost = n * (len(input_ids) + sampling.max_new_tokens)
        while True:
            index = await self._pick()
            member = self._members[index]
            generation = member.generation
            member.inflight_tokens += cost
            try:
                return await member.engine.generate(input_ids, sampling, n)
            except EngineDied:
                self._on_death(index, generation)
                self._counters["redispatched_requests"] += 1
            finally:
                member.inflight_tokens -= cost

    async def update_weights(self, update: WeightUpdate) -> None:
        """Load ``update`` into every live engine (concurrently); one that turns out dead is
        restarted in the background and gets the newest weights then."""
        self._last_update = update
        live = [(i, m, m.generation) for i, m in enumerate(self._members) if m.alive]
        results = await asyncio.gather(*(m.engine.update_weights(update) for _, m, _ in live), return_exceptions=True)
        for (i, _, generation), result in zip(live, results, strict=True):
            if isinstance(result, EngineDied):
                self._on_death(i, generation)  # the incarnation that failed, not a replacement since
            elif isinstance(result, BaseException):
                raise result
        self._version = int(update.version)

    async def pause(self) -> None:
        await asyncio.gather(*(m.engine.pause() for m in self._members if m.alive))

    async def resume(self) -> None:
        await asyncio.gather(*(m.engine.resume() for m in self._members if m.alive))

    async def abort_all(self) -> int:
        return sum(await asyncio.gather(*(m.engine.abort_all() for m in self._members if m.alive)))

    def stats(self) -> dict[str, float]:
        """Counters summed over live engines and those replaced (``slot_utilisation`` averaged,
        ``version`` the lowest), plus ``engines`` (live), ``engine_deaths``, ``engine_restarts``,
        ``redispatched_requests``."""
        parts = [m.engine.stats() for m in self._members if m.alive]
        out: dict[str, float] = {k: v for k, v in self._retired.items() if k in _CUMULATIVE}
        for part in parts:
            for key, value in part.items():
                if isinstance(value, (int, float)):
                    out[key] = out.get(key, 0.0) + float(value)
        if parts:
            out["slot_utilisation"] = sum(float(p.get("slot_utilisation", 0.0)) for p in parts) / len(parts)
            out["version"] = min(float(p.get("version", self._version)) for p in parts)
        out["engines"] = float(sum(m.alive for m in self._members))
        out.update(self._counters)
        return out

    async def wait_restarts(self, timeout_s: float | None = None) -> bool:
        """Wait for the restarts in progress; True when none is left."""
        tasks = list(self._restarting.values())
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        return not self._restarting

    def close(self) -> None:
        for task in self._restarting.values():
            task.cancel()
        for m in self._members:
            m.engine.close()

    # ------------------------------------------------------------------ internals
    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    async def _pick(self) -> int:
        while True:
            live = [i for i, m in enumerate(self._members) if m.alive]
            if live:
                return min(live, key=lambda i: (self._members[i].inflight_tokens, i))
            if not self._restarting:
                raise EngineDied("no live engine left in the pool, and none restarting")
            event = self._event()
            event.clear()
            await event.wait()

    def _on_death(self, index: int, generation: int) -> None:
        """Member ``index`` (as of ``generation``) is dead: out of routing, restart in the background."""
        member = self._members[index]
        if member.generation != generation or not member.alive:
            return  # this death is known already
        member.alive = False
        member.generation += 1
        self._counters["engine_deaths"] += 1
        try:  # keep its cumulative counters (a client reports its last known values)
            for key, value in member.engine.stats().items():
                self._retired[key] = self._retired.get(key, 0.0) + float(value)
        except Exception:  # noqa: BLE001 - no stats from a dead engine: its counts are lost
            pass
        try:
            member.engine.close()
        except Exception:  # noqa: BLE001 - it is dead; closing is best effort
            pass
        if self._restart is None or member.restarts >= self.max_restarts:
            self._event().set()  # retired: waiting requests must look again
            return
        self._restarting[index] = asyncio.get_running_loop().create_task(self._restart_member(index))

    async def _restart_member(self, index: int) -> None:
        member = self._members[index]
        try:
            assert self._restart is not None
            engine = await self._restart(index)
            loaded = None
            while self._last_update is not None and loaded is not self._last_update:
                loaded = self._last_update  # an update may arrive while this one loads: load it too
                await engine.update_weights(loaded)
            member.engine = engine
            member.restarts += 1
            member.alive = True
            self._counters["engine_restarts"] += 1
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the member stays retired; the others carry on
            self.restart_errors.append(f"engine {index}: {type(exc).__name__}: {exc}")
        finally:
            self._restarting.pop(index, None)
            self._event().set()
