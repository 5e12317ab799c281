"""``EnginePool``: several engines behind one engine interface, requests spread by load.

Owns routing and engine replacement. The controller talks to a pool exactly as to one engine
(``generate``, ``update_weights``, ``pause``/``resume``, ``abort_all``, ``version``, ``stats``,
``close``); the members can be ``LocalEngine``, ``RemoteEngine`` or a Ray engine actor's client.

- Routing: a ``generate`` call goes to the live member with the fewest tokens in flight, where a
  request counts ``n x (prompt length + max_new_tokens)`` until it returns (the G samples of one
  prompt stay on one engine and share its prefill). Ties go to the lower index.
- Weight updates go to every member concurrently; the pool keeps the last update so that a
  replaced member is brought to the current version before it takes requests.
- Failure: when a member raises ``EngineDied`` (its process is gone), the pool asks the
  ``restart`` callback for a replacement (at most ``max_restarts`` times per member), loads the
  last weights into it and sends the failed request again, to whichever member is least loaded
  (``redispatched_requests`` counts them). The re-run starts from the request's prompt (which,
  for a resumed interrupted sample, includes its earlier chunks), so nothing is lost and the
  controller sees one completed request. Other exceptions (bad input) propagate unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Completion

__all__ = ["EngineDied", "EnginePool"]

_CUMULATIVE = frozenset(
    ("generated_tokens", "decode_tokens", "decode_steps", "busy_s", "decode_s", "prefill_s", "prefill_tokens",
     "requests", "finished_samples", "aborted_samples", "aborted_requests", "weight_updates", "update_s")
)  # fmt: skip
"""Counters that only grow: a replaced engine's last values stay in the pool's sums."""

RestartFn = Callable[[int], Awaitable[Any]]
"""``restart(index) -> new engine`` (awaited); the pool then loads the last weights into it."""


class EngineDied(RuntimeError):
    """An engine's process is gone (raised by engine clients; the pool restarts the engine)."""


@dataclass
class _Member:
    engine: Any
    inflight_tokens: int = 0
    inflight_requests: int = 0
    restarts: int = 0
    generation: int = 0  # bumps at every replacement (a stale failure report is ignored)
    alive: bool = True


class EnginePool:
    """Engines behind one interface (see module docstring)."""

    def __init__(self, engines: Sequence[Any], *, restart: RestartFn | None = None, max_restarts: int = 3) -> None:
        if not engines:
            raise ValueError("EnginePool needs at least one engine")
        self._members = [_Member(e) for e in engines]
        self._restart = restart
        self.max_restarts = max_restarts
        self._last_update: Any = None
        self._locks = [asyncio.Lock() for _ in engines]
        self._counters = {"redispatched_requests": 0.0, "engine_restarts": 0.0}
        self._retired: dict[str, float] = {}  # cumulative counters of replaced engines
        self._version = min(int(getattr(e, "version", 0)) for e in engines)

    # ------------------------------------------------------------------ engine interface
    @property
    def version(self) -> int:
        """The version of the last update every engine has taken."""
        return self._version

    @property
    def engines(self) -> list[Any]:
        """The current members (replacements included), in routing order."""
        return [m.engine for m in self._members]

    def start(self) -> None:
        for m in self._members:
            if hasattr(m.engine, "start"):
                m.engine.start()

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, n: int = 1) -> list[Completion]:
        """``n`` samples of one prompt from the least-loaded engine (re-sent if that engine dies)."""
        cost = n * (len(input_ids) + sampling.max_new_tokens)
        attempts = 0
        while True:
            index = self._pick()
            member = self._members[index]
            generation = member.generation
            member.inflight_tokens += cost
            member.inflight_requests += 1
            try:
                return await member.engine.generate(input_ids, sampling, n)
            except EngineDied:
                attempts += 1
                await self._replace(index, generation)
                if attempts > (self.max_restarts + 1) * len(self._members):
                    raise
                self._counters["redispatched_requests"] += 1
            finally:
                member.inflight_tokens -= cost
                member.inflight_requests -= 1

    async def update_weights(self, update: Any) -> None:
        """Load ``update`` into every engine (concurrently); a dead engine is replaced and loaded."""
        self._last_update = update
        results = await asyncio.gather(
            *(self._update_one(i, m.generation, update) for i, m in enumerate(self._members) if m.alive),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        self._version = int(update.version)

    async def pause(self) -> None:
        await asyncio.gather(*(m.engine.pause() for m in self._members if m.alive))

    async def resume(self) -> None:
        await asyncio.gather(*(m.engine.resume() for m in self._members if m.alive))

    async def abort_all(self) -> int:
        return sum(await asyncio.gather(*(m.engine.abort_all() for m in self._members if m.alive)))

    def stats(self) -> dict[str, float]:
        """Counters summed over engines (``slot_utilisation`` averaged, ``version`` the lowest),
        plus ``engines``, ``engine_restarts``, ``redispatched_requests``."""
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

    def per_engine_stats(self) -> list[dict[str, float]]:
        """Each engine's own counters, in routing order."""
        return [dict(m.engine.stats()) for m in self._members]

    def close(self) -> None:
        for m in self._members:
            m.engine.close()

    # ------------------------------------------------------------------ internals
    def _pick(self) -> int:
        live = [i for i, m in enumerate(self._members) if m.alive]
        if not live:
            raise EngineDied("no live engine left in the pool")
        return min(live, key=lambda i: (self._members[i].inflight_tokens, i))

    async def _update_one(self, index: int, generation: int, update: Any) -> None:
        try:
            await self._members[index].engine.update_weights(update)
        except EngineDied:
            await self._replace(index, generation)  # the replacement is loaded with this update

    async def _replace(self, index: int, generation: int) -> None:
        """Replace member ``index`` unless that was done since ``generation`` was observed; past
        ``max_restarts`` (or without a restart callback) the member is retired instead. Raises
        ``EngineDied`` when no live engine is left."""
        member = self._members[index]
        member.alive = False
        async with self._locks[index]:
            if member.generation != generation:  # another request already handled this death
                return
            member.generation += 1
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
                if not any(m.alive for m in self._members):
                    raise EngineDied(f"every engine died (engine {index}: {member.restarts} restarts already)")
                return  # retired: the others carry on
            engine = await self._restart(index)
            if self._last_update is not None:
                await engine.update_weights(self._last_update)
            member.engine = engine
            member.restarts += 1
            member.alive = True
            self._counters["engine_restarts"] += 1
