"""``asyncrl.web``'s client side: a request whose connection the server dropped unanswered is sent once
more (and only once), and a client used from ``asyncio.run`` closes cleanly from synchronous code.
(The server side is tested through the engine, door and reward servers: tests/rollout, tests/reward.)"""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import aiohttp
import pytest

from asyncrl.web import JsonClient

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
