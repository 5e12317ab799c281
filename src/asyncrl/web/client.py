"""The client side of asyncrl's HTTP stack: :class:`JsonClient`, the one client every caller sends its
requests through (``RemoteEngine``, ``RemoteRewardClient``, the reward service's ``remote:`` verifiers).

One keep-alive ``aiohttp.ClientSession`` per client object and event loop, made by the loop's first
request and closed with that loop at the latest (see :class:`JsonClient`), so a client used from
``asyncio.run`` after ``asyncio.run``, or from another thread's loop, leaves no socket open; a request
the server dropped before answering (it closed a pooled connection) is sent again once. Code without an
event loop calls :meth:`JsonClient.request_sync` (a loop of its own for the call, on this thread or,
inside a running loop, on a short-lived one). :meth:`JsonClient.call` sends and reads JSON values (the
bytes in and out are :meth:`JsonClient.request`'s).

Imports nothing of the project.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

__all__ = ["JsonClient", "error_message"]

log = logging.getLogger(__name__)


class JsonClient:
    """The HTTP side of a client object: one ``aiohttp.ClientSession`` (keep-alive, at most
    ``max_connections`` connections; more requests wait for one) per event loop it is used from.

    A session lives and dies with its loop: it is made by the loop's first request (synchronously, so
    that concurrent first requests share it) and held open by an async generator of that loop
    (:func:`_held_open`), which every asyncio runner (``asyncio.run``, ``asyncio.Runner``) finalises
    before it closes the loop (``loop.shutdown_asyncgens``), closing the session in its own loop: a loop
    that ends leaves no socket open, even if nobody closed the client. (A loop closed by bare
    ``loop.close()`` skips that step; its connections can then no longer be closed.)

    ``request`` raises ``aiohttp.ClientError`` (``OSError`` for a failed connection) and
    ``asyncio.TimeoutError``; what they mean is the caller's to say. ``aclose`` (inside a loop) or
    ``close`` (anywhere) closes the sessions of every loop."""

    def __init__(self, base_url: str, headers: Mapping[str, str], *, max_connections: int = 100) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = dict(headers)
        self.max_connections = max_connections
        self.retries = 0
        """Requests sent again because the server dropped their connection before answering."""
        self._sessions: dict[asyncio.AbstractEventLoop, _LoopSession] = {}

    async def request(
        self, method: str, path: str, body: bytes | None = None, *, timeout: float | None = None
    ) -> tuple[int, bytes]:
        """(status, body) of ``method path``; ``body`` is sent as JSON; ``timeout``: seconds (None: none)."""
        session = await self._session_here()
        try:
            return await self._send(session, method, path, body, timeout)
        except aiohttp.ServerDisconnectedError:
            self.retries += 1  # a pooled connection the server closed as we sent: once more, on a fresh one
        return await self._send(session, method, path, body, timeout)

    async def call(
        self, method: str, path: str, payload: Any = None, *, timeout: float | None = None
    ) -> tuple[int, Any]:
        """(status, decoded answer) of ``method path`` with ``payload`` sent as compact JSON (None: no body).
        The answer: ``{}`` when empty, ``{"message": <its first 200 characters>}`` when it is not JSON (a
        proxy's error page); what an error answer says is :func:`error_message`'s. Raises as :meth:`request`."""
        body = None if payload is None else json.dumps(payload, separators=(",", ":")).encode()
        status, raw = await self.request(method, path, body, timeout=timeout)
        try:
            return status, json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            return status, {"message": raw[:200].decode("utf-8", "replace")}

    def request_sync(
        self, method: str, path: str, body: bytes | None = None, *, timeout: float | None = None
    ) -> tuple[int, bytes]:
        """:meth:`request` from synchronous code: run on an event loop of its own (``asyncio.run``), whose
        session closes with it; called where a loop already runs on this thread, on a thread of its own
        (blocking this one until it is done, as any synchronous call there does)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.request(method, path, body, timeout=timeout))
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="asyncrl-http-sync") as pool:
            return pool.submit(asyncio.run, self.request(method, path, body, timeout=timeout)).result()

    async def _send(
        self, session: aiohttp.ClientSession, method: str, path: str, body: bytes | None, timeout: float | None
    ) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"} if body is not None else None
        limit = aiohttp.ClientTimeout(total=timeout)
        async with session.request(method, self.base_url + path, data=body, headers=headers, timeout=limit) as resp:
            return resp.status, await resp.read()

    async def _session_here(self) -> aiohttp.ClientSession:
        """This loop's session, made on first use. Nothing is awaited between looking it up and
        registering a new one, so concurrent first requests cannot make two."""
        loop = asyncio.get_running_loop()
        held = self._sessions.get(loop)
        if held is not None and not held.session.closed:
            return held.session
        for gone in [other for other in list(self._sessions) if other.is_closed()]:
            self._sessions.pop(gone, None)  # their sessions closed with them (class docstring)
        connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0)
        session = aiohttp.ClientSession(headers=self.headers, connector=connector)
        held = _LoopSession(session, _held_open(session))
        self._sessions[loop] = held
        await anext(held.keeper)  # runs to its first yield at once: now the loop finalises it
        return session

    async def aclose(self) -> None:
        """Close the session of every loop, waiting until they are closed: this loop's here, a loop
        running on another thread's in that loop. A stopped loop's session is left to ``close``
        (from synchronous code) or to that loop's runner."""
        here = asyncio.get_running_loop()
        sessions, self._sessions = self._sessions, {}
        for loop, held in sessions.items():
            if loop is here:
                await held.keeper.aclose()
            elif loop.is_running():
                closing = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(held.keeper.aclose(), loop))
                try:
                    await asyncio.wait_for(closing, CLOSE_WAIT_S)
                except TimeoutError:  # that loop is blocked or stopped meanwhile: the close stays queued there
                    log.warning("a session on another thread's event loop did not close within %g s", CLOSE_WAIT_S)
            elif not loop.is_closed():
                self._sessions[loop] = held  # no loop runs it now; it cannot be closed from this one

    def close(self) -> None:
        """``aclose`` from synchronous code. Inside a running loop the close finishes in the background
        (before that loop ends: ``await aclose()`` to wait for it); elsewhere it is done on return,
        a stopped loop's session included (that loop is run until it is)."""
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None:
            task = running.create_task(self.aclose())
            _closing.add(task)
            task.add_done_callback(_closing.discard)
            return
        sessions, self._sessions = self._sessions, {}
        for loop, held in sessions.items():
            if loop.is_running():  # another thread's
                closing = asyncio.run_coroutine_threadsafe(held.keeper.aclose(), loop)
                try:
                    closing.result(CLOSE_WAIT_S)
                except concurrent.futures.TimeoutError:  # that loop is blocked: the close stays queued there
                    log.warning("a session on another thread's event loop did not close within %g s", CLOSE_WAIT_S)
            elif not loop.is_closed():
                loop.run_until_complete(held.keeper.aclose())


def error_message(answer: Any) -> Any:
    """What an error answer (decoded by :meth:`JsonClient.call`) says: its ``message``, else all of it."""
    return answer.get("message", answer) if isinstance(answer, dict) else answer


@dataclass(frozen=True)
class _LoopSession:
    """One loop's session and the async generator that closes it when finalised."""

    session: aiohttp.ClientSession
    keeper: AsyncGenerator[None, None]


async def _held_open(session: aiohttp.ClientSession) -> AsyncGenerator[None, None]:
    """Suspended at its one ``yield`` for as long as ``session`` is open; closing it (``aclose``, its
    loop's ``shutdown_asyncgens``, or its collection while the loop runs) closes the session."""
    try:
        yield
    finally:
        await session.close()


CLOSE_WAIT_S = 10.0
"""How long ``JsonClient.close`` waits for a session on another thread's loop to close."""

_closing: set[asyncio.Task] = set()
"""Background closes in flight (a task nobody references may be collected before it runs)."""
