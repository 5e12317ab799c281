"""Bookkeeping records of ``LocalEngine``: a request (one ``generate`` call), a running sample (one
slot), and the thread-safe hand-off of results to the caller's event loop."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from asyncrl.rollout.sampling import SEED_MOD, SamplingParams
from asyncrl.types import Completion

__all__ = ["Request", "Sample", "post", "post_call"]


class Request:
    """One ``generate`` call: a prompt and its n samples."""

    def __init__(
        self,
        prompt: list[int],
        sampling: SamplingParams,
        n: int,
        base_seed: int,
        loop,
        fut,
        on_sample_done: Callable[[int], None] | None = None,
    ):
        self.prompt = prompt
        self.sampling = sampling
        self.stop = frozenset(sampling.stop_token_ids)
        self.seeds = [(base_seed + i) % SEED_MOD for i in range(n)]
        self.pending: deque[int] = deque(range(n))  # sample indices not yet admitted
        self.results: list[Completion | None] = [None] * n
        self.remaining = n
        self.live: set[int] = set()  # slots running one of its samples
        self.first_logits: torch.Tensor | None = None  # logits after the prompt (shared by samples)
        self.first_epoch = -1
        self.cancelled = False
        self.loop, self.fut = loop, fut
        self.on_sample_done = on_sample_done  # called on ``loop`` with a sample's index when it ends (not aborted)


class Sample:
    """A running sample: lives in one slot."""

    __slots__ = ("req", "idx", "out", "lps", "vers", "pos", "last", "limit", "interrupts")

    def __init__(self, req: Request, idx: int, limit: int):
        self.req, self.idx, self.limit = req, idx, limit
        self.out: list[int] = []
        self.lps: list[float] = []
        self.vers: list[int] = []
        self.pos = len(req.prompt) - 1  # position of the last token (the next decode input)
        self.last = -1  # the last token; -1 until the first token is sampled
        self.interrupts = 0


def _resolve(fut: asyncio.Future, value: Any = None, exc: BaseException | None = None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)


def post(loop: asyncio.AbstractEventLoop, fut: asyncio.Future, value: Any = None, exc: BaseException | None = None):
    """Resolve ``fut`` on its loop from the engine thread; a caller whose loop has closed is gone."""
    try:
        loop.call_soon_threadsafe(_resolve, fut, value, exc)
    except RuntimeError:  # "Event loop is closed": nobody is waiting any more
        pass


def post_call(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(*args)`` on ``loop`` from the engine thread (dropped if that loop has closed)."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass
