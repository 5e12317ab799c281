"""``asyncrl.web``'s client side: a request whose connection the server dropped unanswered is sent once
more (and only once), and a client used from ``asyncio.run`` closes cleanly from synchronous code.
(The server side is tested through the engine, door and reward servers: tests/rollout, tests/reward.)"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import threading
import time
import warnings
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import aiohttp
import pytest

from asyncrl.auth import ApiKeyAuth
from asyncrl.web import HTTPError, JsonClient, JsonServer, Request, Route, parse_json

ANSWER = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok":true}'


async def _server(drops: int) -> tuple[asyncio.base_events.Server, list[bytes]]:
    """A server that reads each request and closes the first ``drops`` connections without answering."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        if len(seen) > drops:
            writer.write(ANSWER)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), seen


def test_a_dropped_request_is_sent_once_more() -> None:
    async def go() -> tuple[int, bytes, int, int]:
        server, seen = await _server(drops=1)
        client = JsonClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", {"Authorization": "Bearer k"})
        try:
            status, body = await client.request("POST", "/x", b"{}", timeout=10)
        finally:
            await client.aclose()
            server.close()
        assert all(b"Authorization: Bearer k" in head for head in seen)
        return status, body, client.retries, len(seen)

    assert asyncio.run(go()) == (200, b'{"ok":true}', 1, 2)


def test_a_second_drop_is_the_callers_error() -> None:
    async def go() -> int:
        server, seen = await _server(drops=2)
        client = JsonClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", {})
        try:
            with pytest.raises(aiohttp.ServerDisconnectedError):
                await client.request("POST", "/x", b"{}", timeout=10)
        finally:
            await client.aclose()
            server.close()
        return len(seen)

    assert asyncio.run(go()) == 2


def test_close_after_the_loop_ended_leaves_no_open_session(caplog: Any) -> None:
    async def go(client: JsonClient) -> int:
        return (await client.request("GET", "/", timeout=10))[0]

    async def serve_twice() -> None:
        server, _ = await _server(drops=0)
        client = JsonClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", {})
        async with server:
            assert await asyncio.to_thread(lambda: asyncio.run(go(client))) == 200  # another loop, now gone
            assert await go(client) == 200  # this loop: a new session, the old one closed
            await client.aclose()

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(serve_twice())
        gc.collect()
    assert "Unclosed" not in caplog.text


# ---------------------------------------------------------------- the client across event loops


class _CountingServer:
    """A keep-alive HTTP server on its own thread and loop that counts the connections open to it."""

    def __init__(self) -> None:
        self.open = 0
        self.accepted = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="counting-server", daemon=True)
        self.thread.start()
        listening = asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.server = asyncio.run_coroutine_threadsafe(listening, self.loop).result(10)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        self.accepted += 1
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client closed its connection (or the server stops)
        finally:
            self.open -= 1
            writer.close()

    def settled_open(self, timeout_s: float = 30.0) -> int:
        """Connections still open once the client's closes have had ``timeout_s`` to arrive."""
        deadline = time.monotonic() + timeout_s
        while self.open and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.open

    def stop(self) -> None:
        async def stop() -> None:
            self.server.close()
            handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in handlers:  # the connections a failing test left open
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def counting() -> Iterator[_CountingServer]:
    server = _CountingServer()
    yield server
    server.stop()


async def _use(client: JsonClient, concurrent: int = 3) -> None:
    """Several requests at once, so that the pool holds several keep-alive connections."""
    answers = await asyncio.gather(*(client.request("GET", "/", timeout=10) for _ in range(concurrent)))
    assert [status for status, _ in answers] == [200] * concurrent


class _LoopThread:
    """An event loop running on another thread (as the reward server's and the engine server's do)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, call: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(call, self.loop).result(10)

    def end(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def _two_runs_then_close(client: JsonClient) -> None:
    asyncio.run(_use(client))
    asyncio.run(_use(client))
    client.close()


def _one_run_then_close(client: JsonClient) -> None:
    asyncio.run(_use(client))
    client.close()


def _close_inside_the_loop(client: JsonClient) -> None:
    async def go() -> None:
        await _use(client)
        client.close()  # synchronous, inside the loop: finishes before the loop ends

    asyncio.run(go())


def _a_stopped_loop_then_another(client: JsonClient) -> None:
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(_use(client))  # this loop stops, but is not closed yet
        asyncio.run(_use(client))
        client.close()
    finally:
        loop.close()


def _a_thread_loop_and_this_one(client: JsonClient) -> None:
    other = _LoopThread()
    try:
        other.run(_use(client))
        asyncio.run(_use(client))
        other.run(_use(client))  # its session is still there: the other loop did not close it
        client.close()
    finally:
        other.end()


def _aclose_from_another_loop(client: JsonClient) -> None:
    other = _LoopThread()
    try:
        other.run(_use(client))

        async def go() -> None:
            await _use(client)
            await client.aclose()

        asyncio.run(go())
    finally:
        other.end()


@pytest.mark.parametrize(
    "scenario",
    [
        _two_runs_then_close,
        _one_run_then_close,
        _close_inside_the_loop,
        _a_stopped_loop_then_another,
        _a_thread_loop_and_this_one,
        _aclose_from_another_loop,
    ],
)
def test_a_client_used_from_several_loops_closes_every_connection(
    counting: _CountingServer, scenario: Callable[[JsonClient], None]
) -> None:
    client = JsonClient(counting.url, {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scenario(client)
        assert counting.accepted >= 3
        assert counting.settled_open() == 0
        del client
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_concurrent_first_requests_on_a_loop_share_one_session(
    counting: _CountingServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[aiohttp.ClientSession] = []
    real = aiohttp.ClientSession

    def counted(*args: Any, **kwargs: Any) -> aiohttp.ClientSession:
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(aiohttp, "ClientSession", counted)
    client = JsonClient(counting.url, {})
    other = _LoopThread()
    try:
        other.run(_use(client, 1))  # a session on another, still running loop
        asyncio.run(_use(client, 8))  # eight first requests at once on this one
        client.close()
    finally:
        other.end()
    assert len(made) == 2  # one per loop
    assert all(session.closed for session in made)
    assert counting.settled_open() == 0


# ---------------------------------------------------------------- the server when a client half-closes

HEAD = b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 20\r\n\r\n"


def _send_then_half_close(port: int, parts: list[bytes]) -> tuple[bytes, float]:
    """Send ``parts`` (a short pause between them), shut the write side; (all the answer, seconds until
    the server closed the connection)."""
    with socket.create_connection(("127.0.0.1", port), timeout=2 * DEADLINE_S) as s:
        for i, part in enumerate(parts):
            if i:
                time.sleep(0.2)  # the server has handed the request to its handler by now
            s.sendall(part)
        s.shutdown(socket.SHUT_WR)
        started, reply = time.monotonic(), b""
        while chunk := s.recv(65536):
            reply += chunk
        return reply, time.monotonic() - started


DEADLINE_S = 60.0
"""The request and idle deadlines of ``_serve_one``'s server: a close well before it (under half) is the
server acting on the half-close, however slowly a loaded machine gets there."""


def _serve_one(parts: list[bytes]) -> tuple[bytes, float, list[bytes]]:
    """(answer, seconds to close, bodies dispatched) for one client sending ``parts`` to a JsonServer whose
    requests must be complete within ``DEADLINE_S``."""
    dispatched: list[bytes] = []

    async def dispatch(req: Request) -> Any:
        dispatched.append(req.body)
        return {"ok": True}

    async def go() -> tuple[bytes, float]:
        server = JsonServer(
            "test",
            [Route("POST", "/x", dispatch)],
            lambda status, message: {"error": message},
            ApiKeyAuth(None, "test"),
            max_body_bytes=1000,
            request_timeout_s=DEADLINE_S,
            idle_timeout_s=DEADLINE_S,
        )
        port = await server.start()
        try:
            return await asyncio.to_thread(_send_then_half_close, port, parts)
        finally:
            await server.stop()

    reply, seconds = asyncio.run(go())
    return reply, seconds, dispatched


@pytest.mark.parametrize(
    "parts",
    [
        [HEAD + b"0123456789"],
        [HEAD, b"0123456789"],
        [b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n"],  # no last chunk
    ],
    ids=["before-the-handler-reads", "while-the-handler-reads", "chunked"],
)
def test_a_half_close_mid_body_closes_the_connection_without_dispatching(parts: list[bytes]) -> None:
    reply, seconds, dispatched = _serve_one(parts)
    assert dispatched == []  # no half-read request reached the handler
    assert reply == b""  # closed, not answered
    assert seconds < DEADLINE_S / 2  # at once, not at the request deadline


def test_a_half_close_after_a_whole_request_is_answered() -> None:
    reply, seconds, dispatched = _serve_one([HEAD + b"01234567890123456789"])
    assert dispatched == [b"01234567890123456789"]
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b'{"ok":true}')
    assert seconds < DEADLINE_S / 2


def test_json_nested_past_the_parsers_depth_is_a_400() -> None:
    """Every server's one JSON reader: a body nested deeper than Python's parser goes is 400, not a
    ``RecursionError`` answered 500."""
    with pytest.raises(HTTPError, match="nested too deeply") as e:
        parse_json(b"[" * 100_000)
    assert e.value.status == 400
