"""Bookkeeping records of ``LocalEngine``: a request (one ``generate`` call), a running sample (one
slot), and the thread-safe hand-off of results to the caller's event loop."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from asyncrl.rollout.adapters import HeldWeights
from asyncrl.rollout.sampling import SEED_MOD, SamplingParams
from asyncrl.types import Completion, FinishReason

__all__ = ["Request", "Sample", "post", "post_call"]


class Request:
    """One ``generate`` call: a prompt and its n samples."""

    def __init__(
        self,
        prompt: list[int],
        sampling: SamplingParams,
        n: int,
        base_seed: int,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future,
        on_sample_done: Callable[[int], None] | None = None,
        version: int | None = None,
    ) -> None:
        self.prompt = prompt
        self.sampling = sampling
        self.stop_ids = frozenset(sampling.stop_token_ids)
        self.seeds = [(base_seed + i) % SEED_MOD for i in range(n)]
        self.pending: deque[int] = deque(range(n))  # sample indices not yet admitted
        self.results: list[Completion | None] = [None] * n
        self.remaining = n  # samples without a result yet
        self.live_slots: set[int] = set()  # slots running one of its samples
        self.prompt_logits: torch.Tensor | None = None  # logits after the prompt, kept for samples still pending
        self.prompt_logits_epoch = -1  # the scheduler's weights epoch of ``prompt_logits``
        self.cancelled = False
        self.loop, self.future = loop, future
        self.on_sample_done = on_sample_done  # called on ``loop`` with a sample's index when it ends (not aborted)
        self.version = version  # the weight version asked for (None: the engine's current one at intake)
        self.weights: HeldWeights | None = None
        """The weights it runs on (the engine pins it at intake; a full update moves it to the new weights).
        Every token of its samples is stamped with ``weights.version``."""


class Sample:
    """A running sample: lives in one slot."""

    __slots__ = (
        "request",
        "index",
        "limit",
        "output_ids",
        "logprobs",
        "versions",
        "position",
        "last_token",
        "interruptions",
    )

    def __init__(self, request: Request, index: int, limit: int) -> None:
        self.request, self.index, self.limit = request, index, limit
        self.output_ids: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.position = len(request.prompt) - 1  # position of the last token (the next decode input)
        self.last_token = -1  # -1 until the first token is sampled
        self.interruptions = 0

    @property
    def started(self) -> bool:
        """Its first token is sampled: it decodes at every step."""
        return self.last_token >= 0

    def append(self, token: int, logprob: float, version: int) -> FinishReason | None:
        """Add a sampled token; returns why the sample ends with it (``stop``/``length``), else None."""
        self.output_ids.append(token)
        self.logprobs.append(logprob)
        self.versions.append(version)
        self.last_token = token
        self.position += 1
        if token in self.request.stop_ids:
            return "stop"
        if len(self.output_ids) >= self.limit:
            return "length"
        return None

    def completion(self, reason: FinishReason) -> Completion:
        """The sample's result record."""
        return Completion(
            prompt_ids=tuple(self.request.prompt),
            output_ids=tuple(self.output_ids),
            behav_logprobs=tuple(self.logprobs),
            versions=tuple(self.versions),
            finish_reason=reason,
            num_interruptions=self.interruptions,
        )


def _resolve(future: asyncio.Future, value: Any = None, exc: BaseException | None = None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(value)


def post(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future, value: Any = None, exc: BaseException | None = None
) -> None:
    """Resolve ``future`` on its loop from the engine thread; a caller whose loop has closed is gone."""
    try:
        loop.call_soon_threadsafe(_resolve, future, value, exc)
    except RuntimeError:  # "Event loop is closed": nobody is waiting any more
        pass


def post_call(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(*args)`` on ``loop`` from the engine thread (dropped if that loop has closed)."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass
