"""The futures of the Tinker protocol, and the order a model's requests run in.

Every training and sampling request of the client is answered at once with a future
(``{"request_id": ...}``); the client then polls ``/retrieve_future`` until the result is there. This
module owns:

- :class:`FutureStore`: one asyncio task per request; :meth:`FutureStore.retrieve` waits for it at most
  ``poll_s`` seconds and otherwise answers ``try_again`` (a 200 the client polls again on), so a step of
  any length never runs into the client's 45 s read timeout of one poll. A failed request answers the
  client's ``RequestFailedResponse`` (``error`` + ``category``: ``user`` for a request the service
  refuses, ``server`` otherwise), which the client raises as ``RequestFailedError``.
- :class:`SeqOrder`: a model's requests carry ``seq_id`` 1, 2, ... (the client numbers them in the
  order the user called them, and may send chunks of one ``forward_backward`` concurrently); each
  runs when every lower one has finished, as the client's own ordering expects.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["FutureStore", "SeqOrder", "UserError"]

log = logging.getLogger(__name__)

MAX_KEPT = 10_000
"""Finished futures kept for the client to retrieve (the oldest are dropped past this)."""


class UserError(ValueError):
    """A request the service refuses (the client's ``RequestFailedError`` with category ``user``)."""


@dataclass
class _Entry:
    task: asyncio.Task[Any]
    kind: str


class FutureStore:
    """Requests running or done, by request id (see the module docstring)."""

    def __init__(self, poll_s: float = 5.0) -> None:
        self.poll_s = poll_s
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def submit(self, kind: str, work: Callable[[], Awaitable[Any]]) -> str:
        """Start ``work`` now; returns the request id the client polls."""
        request_id = f"{kind}-{uuid.uuid4().hex}"
        task = asyncio.get_running_loop().create_task(work(), name=request_id)
        self._entries[request_id] = _Entry(task, kind)
        while len(self._entries) > MAX_KEPT:
            oldest, entry = next(iter(self._entries.items()))
            if not entry.task.done():
                break
            del self._entries[oldest]
        return request_id

    async def retrieve(self, request_id: str) -> tuple[str, Any]:
        """``("done", result)``, ``("failed", (message, category))`` or ``("pending", None)`` after at
        most ``poll_s`` seconds; ``KeyError`` for an unknown id."""
        entry = self._entries[request_id]
        if not entry.task.done():
            await asyncio.wait({entry.task}, timeout=self.poll_s)
        if not entry.task.done():
            return "pending", None
        exc = entry.task.exception()
        if exc is None:
            return "done", entry.task.result()
        if isinstance(exc, ValueError | KeyError | FileNotFoundError | FileExistsError):
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            return "failed", (str(message), "user")
        log.error("request %s failed", request_id, exc_info=exc)
        return "failed", (f"{type(exc).__name__}: {exc}", "server")

    def pending(self) -> int:
        return sum(1 for e in self._entries.values() if not e.task.done())

    async def close(self) -> None:
        """Cancel what still runs."""
        tasks = [e.task for e in self._entries.values() if not e.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class SeqOrder:
    """Runs a model's requests in ``seq_id`` order (requests without one run in arrival order)."""

    def __init__(self, next_seq: int = 1) -> None:
        self.next_seq = next_seq
        self._cond = asyncio.Condition()
        self._lock = asyncio.Lock()

    async def run(self, seq_id: int | None, work: Callable[[], Awaitable[Any]]) -> Any:
        """Wait for the turn of ``seq_id``, then run ``work`` alone on this model."""
        if seq_id is not None:
            async with self._cond:
                if seq_id < self.next_seq:
                    raise UserError(f"seq_id {seq_id} was already used (the next one is {self.next_seq})")
                await self._cond.wait_for(lambda: self.next_seq == seq_id)
        try:
            async with self._lock:
                return await work()
        finally:
            if seq_id is not None:
                async with self._cond:
                    self.next_seq = seq_id + 1
                    self._cond.notify_all()
