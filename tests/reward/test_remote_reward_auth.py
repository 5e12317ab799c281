"""Reward server security: the API key on every route (iterating ``ROUTES``, so a new endpoint
cannot escape), the loopback rule, refusal logs, and the client (async, sync, and through the
service's ``remote:`` verifier) sending the key."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from asyncrl.auth import API_KEY_ENV, OPEN_ROUTES, InsecureBindError
from asyncrl.cli import main as cli_main
from asyncrl.reward.client import RemoteRewardClient
from asyncrl.reward.remote import ROUTES, RewardServer
from asyncrl.reward.service import RewardService
from tests.reward.test_remote_reward import once

KEY = "reward-key-0123456789"

VALID_BODIES: dict[tuple[str, str], Any] = {
    ("GET", "/health"): None,
    ("POST", "/score"): {"verifier": "arithmetic", "response": "3+9=12 #12", "reference": "12"},
}


@pytest.fixture(scope="module")
def secured() -> Iterator[RewardServer]:
    with RewardServer(num_workers=1, timeout_s=10, api_key=KEY, preload=()) as srv:
        yield srv


def request(port: int, method: str, path: str, body: Any = None, auth: str | None = None) -> tuple[int, str, Any]:
    data = b"" if body is None else json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(data)}\r\n"
    if auth is not None:
        head += f"Authorization: {auth}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head.encode() + b"\r\n" + data)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    headers, _, payload = reply.partition(b"\r\n\r\n")
    return int(headers.split()[1]), headers.decode("latin-1"), json.loads(payload) if payload else None


def test_route_table_is_covered() -> None:
    assert set(ROUTES) == set(VALID_BODIES), "a new endpoint needs a row here (and its auth test)"
    assert OPEN_ROUTES <= set(ROUTES)


@pytest.mark.parametrize("auth", [None, "Bearer wrong", "Bearer " + KEY + "x", "Basic " + KEY, KEY])
def test_every_route_refuses_a_missing_or_wrong_key(secured: RewardServer, auth: str | None, caplog: Any) -> None:
    assert secured.service is not None
    before = secured.service.metrics()["requests"]
    refused = secured.auth.refused
    with caplog.at_level(logging.WARNING, logger="asyncrl.auth"):
        got = {route: request(secured.port, *route, VALID_BODIES[route], auth) for route in ROUTES}
    for route, (status, headers, body) in got.items():
        if route in OPEN_ROUTES:  # liveness only: no metrics, nothing else
            assert (status, body) == (200, {"status": "ok"}), route
            continue
        assert status == 401 and "WWW-Authenticate: Bearer" in headers and "API key" in body["error"], route
    assert secured.service.metrics()["requests"] == before  # nothing was scored
    assert secured.auth.refused - refused == len(ROUTES) - len(OPEN_ROUTES)
    logged = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert logged and all("'POST'" in m and "'/score'" in m and "127.0.0.1:" in m for m in logged)
    assert KEY not in caplog.text


def test_every_route_works_with_the_key(secured: RewardServer) -> None:
    got = {route: request(secured.port, *route, VALID_BODIES[route], f"Bearer {KEY}") for route in ROUTES}
    for route, (status, _, body) in got.items():
        assert status == 200, (route, body)
    assert got[("POST", "/score")][2]["reward"] == 1.0
    assert "metrics" in got[("GET", "/health")][2]  # the key holder sees the metrics


def test_unknown_paths_are_refused_before_routing(secured: RewardServer) -> None:
    assert request(secured.port, "GET", "/nope")[0] == 401  # nothing learnt about the routes
    assert request(secured.port, "GET", "/nope", auth=f"Bearer {KEY}")[0] == 404


def test_clients_send_the_key(secured: RewardServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    good = RemoteRewardClient(secured.url + "#arithmetic", api_key=KEY)
    assert once(good, good.score("3+4=7 #7", "7")) == (1.0, None)
    assert good.score_sync("3+4=7 #7", "8") == (0.0, None)
    assert "metrics" in once(good, good.health())
    for bad in (RemoteRewardClient(secured.url + "#arithmetic"), RemoteRewardClient(secured.url, api_key="no")):
        with pytest.raises(ValueError, match=f"401.*{API_KEY_ENV}"):
            once(bad, bad.score("3+4=7 #7", "7"))
        with pytest.raises(ValueError, match="401"):
            bad.score_sync("3+4=7 #7", "7")
    monkeypatch.setenv(API_KEY_ENV, KEY)  # the service's remote: verifier takes the key from the environment

    async def through_service() -> Any:
        async with RewardService(num_workers=1, preload=()) as svc:
            return await svc.score(f"remote:{secured.url}#arithmetic", "2+2=4 #4", "4")

    result = asyncio.run(through_service())
    assert (result.reward, result.failure) == (1.0, None)


def test_non_loopback_bind_without_a_key_is_refused(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    server = RewardServer(host="0.0.0.0", num_workers=1, preload=())
    with pytest.raises(InsecureBindError, match="reward server on 0.0.0.0 without an API key"):
        server.start()
    assert server.service is None  # refused before anything started
    for what in ("reward", "engine"):
        assert cli_main(["serve", what, "--host", "0.0.0.0", "--model", "unused"]) == 2
        assert "without an API key" in capsys.readouterr().err
    with RewardServer(host="0.0.0.0", num_workers=1, preload=(), api_key=KEY) as srv:  # with a key it starts
        assert srv.port > 0
