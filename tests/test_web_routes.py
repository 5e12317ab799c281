"""Every route every server registers refuses a request without the API key (beyond loopback), read from
the router itself, so that a route added to any table cannot escape the ``_auth`` middleware; and the
route tables are what the router holds."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncrl.auth import OPEN_ROUTES
from asyncrl.models import build_tiny_policy, load_policy
from asyncrl.reward.remote import RewardServer
from asyncrl.rollout.engine import LocalEngine
from asyncrl.rollout.openai_door import ChatDoor, DoorServer
from asyncrl.rollout.server import EngineServer
from asyncrl.web import JsonServer

KEY = "route-table-key-0123456789"


def _request(port: int, method: str, path: str, auth: str | None) -> tuple[int, str, Any]:
    async def go() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n"
        if method == "GET":
            head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        if auth is not None:
            head += f"Authorization: {auth}\r\n"
        writer.write(head.encode() + b"\r\n" + (b"" if method == "GET" else b"{}"))
        await writer.drain()
        raw = await reader.read()
        writer.close()
        return raw

    raw = asyncio.run(asyncio.wait_for(go(), 30))
    headers, _, payload = raw.partition(b"\r\n\r\n")
    return int(headers.split()[1]), headers.decode("latin-1"), json.loads(payload) if payload else None


def _concrete(path: str) -> str:
    return path.replace("{session_id}", "s1")


def _registered(server: JsonServer) -> set[tuple[str, str]]:
    return {(r.method, r.resource.canonical) for r in server.application().router.routes() if r.resource is not None}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalEngine]:
    model, tok = load_policy(build_tiny_policy(tmp_path_factory.mktemp("tiny")))
    eng = LocalEngine(model, tok, max_slots=2, max_seq_len=64)
    yield eng
    eng.close()


class _Served:
    """One server with a key on 0.0.0.0 (beyond loopback) on a loop of its own thread."""

    def __init__(self, http: JsonServer) -> None:
        import threading

        self.http = http
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = asyncio.run_coroutine_threadsafe(http.start("0.0.0.0", 0), self.loop).result(30)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.http.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


def _check_every_route(http: JsonServer, port: int) -> int:
    """Every route of ``http``'s table, without the key and with a wrong one: 401 (the open route: 200,
    liveness only). Returns how many routes were tried."""
    for route in http.routes:
        for auth in (None, "Bearer wrong", KEY):
            status, headers, body = _request(port, route.method, _concrete(route.path), auth)
            if (route.method, route.path) in OPEN_ROUTES:
                assert status == 200, (route, body)
                continue
            assert status == 401 and "WWW-Authenticate: Bearer" in headers, (route, auth, status, body)
    return len(http.routes)


def test_every_route_of_the_engine_server_and_its_door_needs_the_key(engine: LocalEngine) -> None:
    server = EngineServer(engine, api_key=KEY)
    assert _registered(server.http) == {(r.method, r.path) for r in server.http.routes}
    assert set(EngineServer.ROUTES) | {(r.method, r.path) for r in server.door.routes()} == _registered(server.http)
    engine.start()
    served = _Served(server.http)
    try:
        assert _check_every_route(server.http, served.port) == len(EngineServer.ROUTES) + 7  # the door: 7 routes
    finally:
        served.stop()
        server.door.close()
    assert engine.stats()["requests"] == 0


def test_every_route_of_the_door_server_needs_the_key(engine: LocalEngine, tmp_path: Path) -> None:
    door = DoorServer(ChatDoor(engine, engine.tokenizer), KEY)
    assert _registered(door.http) == {(r.method, r.path) for r in door.http.routes}
    served = _Served(door.http)
    try:
        assert _check_every_route(door.http, served.port) == 7  # sessions, chat, models, completion rewards
        assert _request(served.port, "GET", "/nope", None)[0] == 401  # an unknown path learns nothing either
    finally:
        served.stop()
        door.door.close()


def test_every_route_of_the_reward_server_needs_the_key() -> None:
    with RewardServer(host="0.0.0.0", num_workers=1, api_key=KEY, preload=()) as server:
        assert _registered(server.http) == {(r.method, r.path) for r in server.http.routes}
        assert _check_every_route(server.http, server.port) == 2
        assert server.service is not None and server.service.metrics()["requests"] == 0
