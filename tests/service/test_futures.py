"""Futures answer ``try_again`` while a step runs (so a long step never times out a poll) and keep a
model's requests in ``seq_id`` order whatever order they arrive in."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.service.futures import FutureStore, SeqOrder, UserError


def test_a_slow_request_answers_try_again_until_it_is_done() -> None:
    async def main() -> list[str]:
        store = FutureStore(poll_s=0.01)
        release = asyncio.Event()

        async def slow() -> dict:
            await release.wait()
            return {"ok": 1}

        request_id = store.submit("optim_step", slow)
        states = [(await store.retrieve(request_id))[0] for _ in range(3)]
        release.set()
        states.append((await store.retrieve(request_id))[0])
        assert (await store.retrieve(request_id))[1] == {"ok": 1}
        return states

    assert asyncio.run(main()) == ["pending", "pending", "pending", "done"]


def test_a_failed_request_says_whose_fault_it_is() -> None:
    async def main() -> list[tuple[str, object]]:
        store = FutureStore(poll_s=1.0)

        async def refused() -> None:
            raise ValueError("lora rank must be >= 1")

        async def broken() -> None:
            raise RuntimeError("out of memory")

        return [await store.retrieve(store.submit("x", refused)), await store.retrieve(store.submit("y", broken))]

    assert asyncio.run(main()) == [
        ("failed", ("lora rank must be >= 1", "user")),
        ("failed", ("RuntimeError: out of memory", "server")),
    ]
    with pytest.raises(KeyError):
        asyncio.run(FutureStore().retrieve("nope"))


def test_requests_run_in_seq_id_order_whatever_order_they_arrive_in() -> None:
    async def main() -> list[int]:
        order, ran = SeqOrder(), []

        async def job(i: int) -> int:
            ran.append(i)
            return i

        tasks = [asyncio.create_task(order.run(i, lambda i=i: job(i))) for i in (3, 1, 4, 2)]
        await asyncio.gather(*tasks)
        with pytest.raises(UserError, match="already used"):
            await order.run(2, lambda: job(2))
        return ran

    assert asyncio.run(main()) == [1, 2, 3, 4]
