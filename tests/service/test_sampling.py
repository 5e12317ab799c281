"""The service's engine pool: a LoRA model's update (the adapters alone) reaches its live engine while
samples run, each finishing on its own version; a full update still waits for them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from asyncrl.models import load_policy
from asyncrl.service.sampling import EnginePool, EngineSpec, SamplerTarget
from asyncrl.types import WeightUpdate
from tests.rollout.test_adapters import make_adapter

NOWHERE = "/nonexistent/sampler-checkpoint"
"""A target directory no snapshot engine can load: a sample that reaches one fails."""


def _params(max_tokens: int) -> dict:
    return {"max_tokens": max_tokens, "temperature": 1.0, "seed": 0}


def test_an_adapter_update_does_not_wait_for_the_samples_in_flight(tiny_policy_dir: Path) -> None:
    probe = load_policy(tiny_policy_dir)[0]
    a1, a2 = make_adapter(probe, seed=1), make_adapter(probe, seed=2)
    prompt = [5, 9, 13, 2, 40, 7]

    async def go():
        pool = EnginePool(EngineSpec(max_slots=4, max_seq_len=256, keep_versions=1))
        try:
            await pool.publish("run", tiny_policy_dir, WeightUpdate(1, adapter=a1))
            first = asyncio.ensure_future(pool.sample(SamplerTarget(NOWHERE, 1, "run"), prompt, _params(200), 2, []))
            for _ in range(5):
                await asyncio.sleep(0)
            await pool.publish("run", tiny_policy_dir, WeightUpdate(2, adapter=a2))
            in_flight = not first.done()
            held = pool.live_versions("run")
            second = await pool.sample(SamplerTarget(NOWHERE, 2, "run"), prompt, _params(10), 3, [])
            return in_flight, held, await first, second, pool.live_versions("run")
        finally:
            await pool.close()

    in_flight, held, first, second, held_after = asyncio.run(asyncio.wait_for(go(), timeout=120))
    assert in_flight and held == (1, 2)  # the update reached the engine while version 1's samples ran
    assert [c.finish_reason for c in first] == ["length"] * 2
    assert all(c.versions == (1,) * 200 for c in first)  # finished on the version they started with
    assert all(c.versions == (2,) * 10 for c in second)  # on the live engine: no snapshot (NOWHERE) was loaded
    assert held_after == (2,)


def test_a_full_update_still_waits_for_the_samples_running(tiny_policy_dir: Path) -> None:
    prompt = [5, 9, 13, 2, 40, 7]
    state = load_policy(tiny_policy_dir)[0].state_dict()

    async def go():
        pool = EnginePool(EngineSpec(max_slots=4, max_seq_len=256))
        try:
            await pool.publish("run", tiny_policy_dir, WeightUpdate(1, tensors=state))
            first = asyncio.ensure_future(pool.sample(SamplerTarget(NOWHERE, 1, "run"), prompt, _params(60), 2, []))
            for _ in range(5):
                await asyncio.sleep(0)
            await pool.publish("run", tiny_policy_dir, WeightUpdate(2, tensors=state))
            return first.done(), await first, pool.live_versions("run")
        finally:
            await pool.close()

    done_before_update, first, held = asyncio.run(asyncio.wait_for(go(), timeout=120))
    assert done_before_update and held == (2,)
    assert all(c.versions == (1,) * 60 and c.finish_reason == "length" for c in first)
