"""Remote rewards: the HTTP server (serve_reward / RewardServer), its client, and the service's
``remote:`` verifier."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

from asyncrl.reward import InfrastructureError
from asyncrl.reward.client import RemoteRewardClient
from asyncrl.reward.remote import RewardServer, serve_reward
from asyncrl.reward.service import RewardService


@pytest.fixture(scope="module")
def server() -> Iterator[RewardServer]:
    with RewardServer(num_workers=2, timeout_s=10, max_body_bytes=200_000) as srv:
        yield srv


def once(client: RemoteRewardClient, call: Coroutine[Any, Any, Any]) -> Any:
    """``call`` on a fresh event loop, then the client's pooled connections closed (they are that loop's)."""

    async def go() -> Any:
        try:
            return await call
        finally:
            await client.close()

    return asyncio.run(go())


def raw_http(port: int, data: bytes) -> tuple[int, dict[str, Any]]:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server answered and closed already (e.g. 411)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    return status, json.loads(body) if body else {}


def post(port: int, body: bytes, path: str = "/score", headers: str | None = None) -> tuple[int, dict[str, Any]]:
    headers = headers if headers is not None else f"Content-Length: {len(body)}\r\n"
    return raw_http(port, f"POST {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode() + body)


def test_score_and_health(server: RewardServer) -> None:
    client = RemoteRewardClient(server.url)
    assert once(client, client.score("so \\boxed{1,234}", "1234")) == (1.0, None)
    assert once(client, client.score("so \\boxed{5}", "1234")) == (0.0, None)
    assert client.score_sync("#### 7", "7") == (1.0, None)
    code = RemoteRewardClient(server.url + "#code")
    assert once(code, code.score("def f():\n    return 1\n", "assert f() == 1")) == (1.0, None)
    health = once(client, client.health())
    assert health["status"] == "ok" and health["metrics"]["verdicts"] >= 4


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{not json", 400),
        (b"\xff\xfe", 400),
        (b"[1, 2]", 400),
        (b'{"response": "x"}', 400),
        (b'{"response": 1, "reference": "1"}', 400),
        (b'{"response": "x", "reference": "1", "row": [1]}', 400),
        (b'{"response": "x", "reference": "1", "prompt": 3}', 400),
        (b'{"verifier": "nope", "response": "x", "reference": "1"}', 400),
        (b'{"verifier": 5, "response": "x", "reference": "1"}', 400),
        (b'{"verifier": "remote:http://127.0.0.1:9", "response": "x", "reference": "1"}', 400),
        (b'{"verifier": "custom:os:system", "response": "x", "reference": "1"}', 403),
    ],
)
def test_malformed_requests_get_4xx(server: RewardServer, body: bytes, status: int) -> None:
    got, reply = post(server.port, body)
    assert got == status and "error" in reply


def test_protocol_errors_and_the_server_keeps_serving(server: RewardServer) -> None:
    assert post(server.port, b"{}", path="/nope")[0] == 404
    assert raw_http(server.port, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 404
    assert post(server.port, b"", headers="")[0] == 411  # a POST without a framed body
    assert post(server.port, b"{}", headers="")[0] == 400  # and what follows it is no request
    assert post(server.port, b"{}", headers="Content-Length: abc\r\n")[0] == 400
    assert post(server.port, b"x" * 300_000)[0] == 413
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"\x00\x01garbage\r\n\r\n")
    client = RemoteRewardClient(server.url)
    assert client.score_sync("\\boxed{2}", "2") == (1.0, None)


def test_client_errors() -> None:
    with pytest.raises(ValueError):
        RemoteRewardClient("ftp://host:1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    client = RemoteRewardClient(f"http://127.0.0.1:{port}", timeout_s=2)
    with pytest.raises(InfrastructureError):
        once(client, client.score("a", "b"))
    with pytest.raises(InfrastructureError):
        client.score_sync("a", "b")


def test_service_remote_verifier(server: RewardServer) -> None:
    async def main() -> None:
        async with RewardService(num_workers=1, timeout_s=10, max_retries=1, preload=()) as svc:
            r = await svc.score(f"remote:{server.url}", "The answer is 12.", "12")
            assert (r.reward, r.failure) == (1.0, None)
            r = await svc.score(f"remote:{server.url}#code", "x = 1\n", "assert x == 2\n")
            assert (r.reward, r.failure) == (0.0, None)
            assert svc.metrics()["workers_started"] == 0  # remote calls need no local worker
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                dead = f"remote:http://127.0.0.1:{s.getsockname()[1]}"
            r = await svc.score(dead, "a", "b")
            assert r.failure is not None and r.failure.startswith("error: ") and r.reward == 0.0
            assert svc.metrics()["retries"] == 1
            r = await svc.score(f"remote:{server.url}#custom:os:system", "a", "b")
            assert r.failure is not None and "403" in r.failure

    asyncio.run(asyncio.wait_for(main(), 60))


def test_custom_verifiers_on_a_server_that_allows_them() -> None:
    with RewardServer(num_workers=1, allow_custom=True) as srv:
        client = RemoteRewardClient(srv.url + "#custom:asyncrl.reward.custom:to_reward")
        # to_reward(prompt, completion, row) -> TypeError (a verifier error, reported as a failure)
        reward, failure = client.score_sync("a", "b")
        assert reward == 0.0 and failure is not None and failure.startswith("error: ")


def test_serve_reward_blocks_until_stopped() -> None:
    stop = threading.Event()
    urls: list[str] = []
    thread = threading.Thread(
        target=serve_reward,
        kwargs={"port": 0, "num_workers": 1, "on_ready": urls.append, "stop": stop, "preload": ()},
        daemon=True,
    )
    thread.start()
    for _ in range(100):
        if urls:
            break
        threading.Event().wait(0.1)
    assert urls and urls[0].startswith("http://127.0.0.1:")
    assert RemoteRewardClient(urls[0] + "#arithmetic").score_sync("#3", "3") == (1.0, None)
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive()
