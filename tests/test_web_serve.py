"""``asyncrl.web.server.serve_forever``, what ``asyncrl serve engine`` and ``asyncrl serve training`` run: the
server answers once its banner is out, Ctrl-C (SIGINT) stops it and returns, and an error starting it is raised."""

from __future__ import annotations

import asyncio
import signal
import socket

import aiohttp
import pytest

from asyncrl.auth import ApiKeyAuth
from asyncrl.web import JsonServer, Request, Route
from asyncrl.web.server import serve_forever


class _Interrupted:
    """A ``JsonServer`` that, once listening, asks itself one request and then sends this process SIGINT
    (as Ctrl-C does)."""

    def __init__(self) -> None:
        async def hello(req: Request) -> dict[str, str]:
            return {"hello": "world"}

        self.http = JsonServer(
            "test server",
            [Route("GET", "/hello", hello)],
            lambda status, message, *_: {"error": message},
            ApiKeyAuth(None, "test server"),
            max_body_bytes=1024,
            request_timeout_s=10.0,
            idle_timeout_s=10.0,
        )
        self.answer: object = None
        self.stopped = False
        self._probe: asyncio.Task | None = None

    async def start(self, host: str, port: int) -> int:
        bound = await self.http.start(host, port)
        self._probe = asyncio.get_running_loop().create_task(self._ask_then_interrupt(host, bound))
        return bound

    async def _ask_then_interrupt(self, host: str, port: int) -> None:
        async with aiohttp.ClientSession() as session, session.get(f"http://{host}:{port}/hello") as resp:
            self.answer = (resp.status, await resp.json())
        signal.raise_signal(signal.SIGINT)

    async def stop(self) -> None:
        self.stopped = True
        await self.http.stop()


def test_serves_until_interrupted_then_stops(capsys: pytest.CaptureFixture[str]) -> None:
    server = _Interrupted()
    serve_forever(server, "127.0.0.1", 0, lambda bound: f"test server on port {bound}")  # returns on SIGINT
    assert server.answer == (200, {"hello": "world"})
    assert server.stopped
    assert capsys.readouterr().out == f"test server on port {server.http.port}\n"
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):  # it listens no more
        probe.connect(("127.0.0.1", server.http.port))


def test_an_error_starting_is_raised() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = _Interrupted()
        with pytest.raises(OSError):
            serve_forever(server, "127.0.0.1", port, lambda bound: "never printed")
    assert not server.stopped
