"""``controller.fixed_lag``'s ring of exports: which version the engine holds after each step, the
end of the run, and the refusal to resume."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.controller.fixed_lag import LaggedWeights
from asyncrl.types import WeightUpdate


class FakeEngine:
    def __init__(self) -> None:
        self.version = 0
        self.loads: list[int] = []

    async def update_weights(self, update: WeightUpdate) -> None:
        self.version = update.version
        self.loads.append(update.version)


def _update(v: int) -> WeightUpdate:
    return WeightUpdate(version=v, tensors={"w": v})


async def _export_v0() -> WeightUpdate:
    return _update(0)


def _run(lag: int, steps: int) -> tuple[LaggedWeights, FakeEngine, list[int]]:
    ring, engine, held = LaggedWeights(lag), FakeEngine(), []

    async def go() -> None:
        await ring.start(_export_v0)
        for v in range(1, steps + 1):  # step v - 1 publishes version v
            await ring.publish(engine, _update(v))
            held.append(engine.version)

    asyncio.run(go())
    return ring, engine, held


@pytest.mark.parametrize("lag", [0, 1, 2, 4])
def test_the_engine_trails_by_exactly_the_lag(lag: int) -> None:
    ring, engine, held = _run(lag, 8)
    # after step i (published version i + 1) the engine holds max(0, i + 1 - k): step i + 1 samples it
    assert held == [max(0, v - lag) for v in range(1, 9)]
    assert ring.engine_version == engine.version and ring.latest.version == 8
    assert engine.loads == list(range(1, 9 - lag))  # nothing loaded until the lag has passed


def test_lag_zero_is_ordinary_publishing() -> None:
    _, engine, held = _run(0, 5)
    assert held == [1, 2, 3, 4, 5] and engine.loads == [1, 2, 3, 4, 5]


def test_the_end_of_the_run_leaves_the_newest_weights() -> None:
    ring, engine, _ = _run(3, 5)  # the engine holds version 2
    assert engine.version == 2
    asyncio.run(ring.finish(engine))
    assert engine.version == 5 and ring.engine_version == 5


def test_exports_must_be_consecutive_and_resume_is_refused() -> None:
    ring = LaggedWeights(2)
    asyncio.run(ring.start(_export_v0))
    with pytest.raises(ValueError, match="one version at a time"):
        ring.select(_update(3))
    with pytest.raises(ValueError, match="cannot resume"):
        LaggedWeights.check_resume(2, resuming=True)
    LaggedWeights.check_resume(0, resuming=True)  # k = 0 is synchronous training: nothing to lose
    LaggedWeights.check_resume(None, resuming=True)
