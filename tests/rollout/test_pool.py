"""EnginePool: least-loaded routing, weights to every engine, restart and re-dispatch on death."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from asyncrl.rollout.pool import EngineDied, EnginePool
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Completion, WeightUpdate


class FakeEngine:
    """Answers after ``delay`` seconds; ``die_after`` requests later it raises EngineDied forever."""

    def __init__(self, name: str, delay: float = 0.01, die_after: int | None = None) -> None:
        self.name, self.delay, self.die_after = name, delay, die_after
        self.version = 0
        self.requests: list[tuple[int, ...]] = []
        self.updates: list[int] = []
        self.closed = False
        self.generated = 0

    async def generate(self, input_ids: Any, sampling: SamplingParams, n: int = 1) -> list[Completion]:
        if self.die_after is not None and len(self.requests) >= self.die_after:
            raise EngineDied(f"{self.name} is gone")
        self.requests.append(tuple(input_ids))
        await asyncio.sleep(self.delay)
        self.generated += n
        out = (7,)
        return [Completion(tuple(input_ids), out, (-0.5,), (self.version,), "stop") for _ in range(n)]

    async def update_weights(self, update: WeightUpdate) -> None:
        if self.die_after is not None and len(self.requests) >= self.die_after:
            raise EngineDied(f"{self.name} is gone")
        self.updates.append(update.version)
        self.version = update.version

    def stats(self) -> dict[str, float]:
        return {
            "generated_tokens": float(self.generated),
            "prefix_hits": float(len(self.requests)),  # a stand-in for any cumulative engine counter
            "version": float(self.version),
            "slot_utilisation": 0.5,
        }

    def close(self) -> None:
        self.closed = True


SP = SamplingParams(max_new_tokens=10)


def test_requests_go_to_the_engine_with_fewest_tokens_in_flight() -> None:
    a, b = FakeEngine("a", delay=0.2), FakeEngine("b", delay=0.2)
    pool = EnginePool([a, b])

    async def run() -> None:
        big = asyncio.create_task(pool.generate([1] * 50, SP, 4))  # 4 x 60 tokens on a
        await asyncio.sleep(0)
        small = [asyncio.create_task(pool.generate([2], SP, 1)) for _ in range(3)]  # 11 each: all fit on b
        await asyncio.gather(big, *small)

    asyncio.run(run())
    assert a.requests == [tuple([1] * 50)]
    assert b.requests == [(2,)] * 3


def test_weights_reach_every_engine_and_stats_are_summed() -> None:
    a, b = FakeEngine("a"), FakeEngine("b")
    pool = EnginePool([a, b])

    async def run() -> None:
        await pool.update_weights(WeightUpdate(version=3, path="/nowhere"))
        await asyncio.gather(*(pool.generate([5], SP, 2) for _ in range(4)))

    asyncio.run(run())
    assert a.updates == b.updates == [3] and pool.version == 3
    stats = pool.stats()
    assert stats["generated_tokens"] == 8 and stats["engines"] == 2 and stats["version"] == 3


def test_a_dead_engine_is_restarted_with_the_last_weights_and_its_request_sent_again() -> None:
    dying = FakeEngine("dying", die_after=1)
    other = FakeEngine("other", delay=0.05)
    spawned: list[FakeEngine] = []

    async def restart(index: int) -> FakeEngine:
        assert index == 0
        spawned.append(FakeEngine(f"new{len(spawned)}"))
        return spawned[-1]

    pool = EnginePool([dying, other], restart=restart, max_restarts=2)

    async def run() -> list[list[Completion]]:
        await pool.update_weights(WeightUpdate(version=2, path="/nowhere"))
        out = await asyncio.gather(*(pool.generate([i + 1], SP, 1) for i in range(6)))
        assert await pool.wait_restarts(5.0)  # the restart ran in the background
        await pool.update_weights(WeightUpdate(version=3, path="/nowhere"))
        return out

    results = asyncio.run(run())
    assert all(len(r) == 1 and r[0].output_ids == (7,) for r in results)  # nothing lost
    served = dying.requests + other.requests + [q for e in spawned for q in e.requests]
    assert sorted(served) == [(i + 1,) for i in range(6)]  # each request answered exactly once
    assert len(spawned) == 1 and spawned[0].updates == [2, 3] and dying.closed  # newest weights, then the next
    assert pool.engines == [spawned[0], other]
    stats = pool.stats()
    assert stats["engine_deaths"] == stats["engine_restarts"] == 1 and stats["redispatched_requests"] == 1
    assert len(dying.requests) == 1 and stats["prefix_hits"] == 6  # the replaced engine's counters stay in the sum


def test_past_max_restarts_the_engine_is_retired_and_the_others_carry_on() -> None:
    dying = FakeEngine("dying", die_after=0)
    other = FakeEngine("other")
    pool = EnginePool([dying, other], restart=None)

    async def run() -> list[Any]:
        return await asyncio.wait_for(asyncio.gather(*(pool.generate([3], SP, 1) for _ in range(3))), 30)

    results = asyncio.run(run())
    assert len(results) == 3 and len(other.requests) == 3
    assert pool.stats()["engines"] == 1

    alone = EnginePool([FakeEngine("x", die_after=0)])
    with pytest.raises(EngineDied, match="no live engine"):
        asyncio.run(alone.generate([1], SP, 1))


def test_other_errors_propagate_unchanged() -> None:
    class Picky(FakeEngine):
        async def generate(self, input_ids: Any, sampling: SamplingParams, n: int = 1) -> list[Completion]:
            raise ValueError("input_ids is empty")

    pool = EnginePool([Picky("p")], restart=None)
    with pytest.raises(ValueError, match="empty"):
        asyncio.run(pool.generate([], SP, 1))
    with pytest.raises(ValueError):
        EnginePool([])


def test_requests_wait_for_a_restart_when_no_engine_is_live() -> None:
    spawned: list[FakeEngine] = []

    async def restart(index: int) -> FakeEngine:
        await asyncio.sleep(0.1)
        spawned.append(FakeEngine("back"))
        return spawned[-1]

    pool = EnginePool([FakeEngine("only", die_after=0)], restart=restart, max_restarts=1)

    async def run() -> list[Any]:
        await pool.update_weights(WeightUpdate(version=5, path="/nowhere"))  # dies here: restart starts
        return await asyncio.wait_for(asyncio.gather(*(pool.generate([9], SP, 1) for _ in range(3))), 30)

    assert len(asyncio.run(run())) == 3
    assert spawned[0].updates == [5] and len(spawned[0].requests) == 3
