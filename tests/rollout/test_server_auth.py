"""Engine server security: the API key on every route (iterating the server's route table, so a new
endpoint cannot escape), the loopback rule, refusal logs, RemoteEngine sending the key, and weight
updates confined to the weights root."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from asyncrl.auth import API_KEY_ENV, OPEN_ROUTES, InsecureBindError
from asyncrl.models import stop_token_ids
from asyncrl.rollout.engine import LocalEngine
from asyncrl.rollout.remote import RemoteEngine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.server import EngineServer, ServerThread
from asyncrl.types import WeightUpdate

KEY = "test-key-0123456789"

# a request every route answers with 200, given the key (a route missing here fails the test)
VALID_BODIES: dict[tuple[str, str], Any] = {
    ("GET", "/health"): None,
    ("GET", "/health_generate"): None,
    ("GET", "/model_info"): None,
    ("GET", "/get_model_info"): None,
    ("GET", "/get_weight_version"): None,
    ("GET", "/stats"): None,
    ("GET", "/get_server_info"): None,
    ("POST", "/generate"): {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}},
    ("PUT", "/generate"): {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}},
    ("POST", "/pause_generation"): {"mode": "in_place"},
    ("POST", "/continue_generation"): {},
    ("POST", "/update_weights_from_disk"): {"model_path": "v00000001", "weight_version": 1},
}


@pytest.fixture
def secured(load_tiny: Any, tiny_dir: Path, tmp_path: Path) -> Any:
    from safetensors.torch import save_file

    model, tok = load_tiny()
    root = tmp_path / "exports"
    (root / "v00000001").mkdir(parents=True)
    save_file({k: v.clone() for k, v in model.state_dict().items()}, str(root / "v00000001" / "model.safetensors"))
    eng = LocalEngine(model, tok, max_slots=8, max_seq_len=128)
    srv = ServerThread(
        eng, model_path=str(tiny_dir), eos_ids=stop_token_ids(tok, model), api_key=KEY, weights_root=root
    )
    yield eng, srv, root
    srv.stop()
    eng.close()


async def request(port: int, method: str, path: str, body: Any = None, auth: str | None = None) -> tuple[int, Any]:
    data = b"" if body is None else json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(data)}\r\n"
    if auth is not None:
        head += f"Authorization: {auth}\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head.encode() + b"\r\n" + data)
    await writer.drain()
    raw = await reader.read()
    writer.close()
    headers, _, payload = raw.partition(b"\r\n\r\n")
    return int(headers.split()[1]), (headers.decode("latin-1"), json.loads(payload) if payload else None)


def test_route_table_is_covered() -> None:
    assert set(EngineServer.ROUTES) == set(VALID_BODIES), "a new endpoint needs a row here (and its auth test)"
    assert OPEN_ROUTES <= set(EngineServer.ROUTES)


@pytest.mark.parametrize("auth", [None, "Bearer wrong-key", "Bearer " + KEY[:-1], "Basic " + KEY, KEY])
def test_every_route_refuses_a_missing_or_wrong_key(secured: Any, arun: Any, auth: str | None, caplog: Any) -> None:
    eng, srv, _ = secured
    version = eng.version

    async def go() -> dict[tuple[str, str], tuple[int, Any]]:
        return {
            route: await request(srv.server.port, *route, VALID_BODIES[route], auth) for route in EngineServer.ROUTES
        }

    with caplog.at_level(logging.WARNING, logger="asyncrl.auth"):
        got = arun(go())
    for route, (status, (headers, body)) in got.items():
        if route in OPEN_ROUTES:  # liveness only: nothing revealed
            assert (status, body) == (200, {"status": "ok"}), route
            continue
        assert status == 401, route
        assert "WWW-Authenticate: Bearer" in headers and body["code"] == 401 and "API key" in body["message"]
    # nothing happened: no generation, no pause, no weight update
    assert eng.stats()["requests"] == 0 and not eng.paused and eng.version == version
    refused = len(EngineServer.ROUTES) - len(OPEN_ROUTES)
    assert srv.server.auth.refused == refused
    logged = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(logged) == refused and all("127.0.0.1:" in m for m in logged)
    assert not any(KEY in m for m in caplog.text.splitlines())


def test_every_route_works_with_the_key(secured: Any, arun: Any) -> None:
    eng, srv, _ = secured

    async def go() -> dict[tuple[str, str], tuple[int, Any]]:
        out = {}
        for route in EngineServer.ROUTES:  # pause_generation comes before continue_generation
            out[route] = await request(srv.server.port, *route, VALID_BODIES[route], f"Bearer {KEY}")
        return out

    for route, (status, (_, body)) in arun(go()).items():
        assert status == 200, (route, body)
    assert eng.version == 1 and not eng.paused and eng.stats()["requests"] == 2
    # the authenticated /health is the same: it never reveals more
    assert arun(request(srv.server.port, "GET", "/health", None, f"Bearer {KEY}"))[1][1] == {"status": "ok"}


def test_refused_before_the_body_is_read(secured: Any, arun: Any) -> None:
    _, srv, _ = secured
    raw = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n"

    async def go() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.server.port)
        writer.write(raw)
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        writer.close()
        return status

    assert arun(go()) == 401  # not 413: an unauthenticated client learns nothing about limits


def test_remote_engine_sends_the_key(secured: Any, arun: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    eng, srv, root = secured
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    sp = SamplingParams(max_new_tokens=3)

    async def go() -> tuple[Any, ...]:
        good = RemoteEngine(srv.url, api_key=KEY)
        (c,) = await good.generate([5, 6], sp)
        await good.update_weights(WeightUpdate(4, path=str(root / "v00000001")))
        good.close()
        errors = []
        for bad in (RemoteEngine(srv.url), RemoteEngine(srv.url, api_key="nope")):
            with pytest.raises(PermissionError, match="401") as info:
                await bad.generate([5, 6], sp)
            errors.append(str(info.value))
            bad.close()
        monkeypatch.setenv(API_KEY_ENV, KEY)
        from_env = RemoteEngine(srv.url)
        (d,) = await from_env.generate([5, 6], sp)
        from_env.close()
        return c, d, errors

    c, d, errors = arun(go())
    assert len(c.output_ids) == len(d.output_ids) == 3 and eng.version == 4
    assert API_KEY_ENV in errors[0] and "wrong API key" in errors[1] and "nope" not in errors[1]


def test_non_loopback_bind_without_a_key_is_refused(load_tiny: Any, arun: Any) -> None:
    model, tok = load_tiny()
    eng = LocalEngine(model, tok, max_slots=2, max_seq_len=64)
    try:
        with pytest.raises(InsecureBindError, match="without an API key"):
            ServerThread(eng, host="0.0.0.0")
        with pytest.raises(InsecureBindError):
            arun(EngineServer(eng).start("0.0.0.0", 0))
        srv = ServerThread(eng, host="0.0.0.0", api_key=KEY)  # with a key it starts
        assert srv.server.port > 0
        srv.stop()
    finally:
        eng.close()


def _update(port: int, path: str) -> tuple[int, Any]:
    return asyncio.run(request(port, "POST", "/update_weights_from_disk", {"model_path": path}, f"Bearer {KEY}"))


def test_weight_updates_are_confined_to_the_root(secured: Any, tmp_path: Path) -> None:
    import shutil

    eng, srv, root = secured
    outside = tmp_path / "outside"
    shutil.copytree(root / "v00000001", outside)  # loadable weights, but not the run's
    (root / "escape").symlink_to(outside)
    (root / "v00000001" / "up").symlink_to("../..")
    for path in (
        str(outside),
        str(root / ".." / "outside"),
        "../outside",
        str(root / "escape"),
        "escape",
        "v00000001/up/outside",
        "/etc",
    ):
        status, (_, body) = _update(srv.server.port, path)
        assert status == 403 and "outside this server's weights root" in body["message"], path
    assert eng.version == 0
    assert _update(srv.server.port, str(root / "v00000001"))[0] == 200 and eng.version == 1


def test_no_weights_root_refuses_every_disk_update(load_tiny: Any, tmp_path: Path) -> None:
    model, tok = load_tiny()
    eng = LocalEngine(model, tok, max_slots=2, max_seq_len=64)
    srv = ServerThread(eng, api_key=KEY)
    try:
        status, (_, body) = _update(srv.server.port, str(tmp_path))
        assert status == 403 and "--weights-root" in body["message"] and eng.version == 0
    finally:
        srv.stop()
        eng.close()


def test_a_get_with_a_body_is_refused_before_the_body_is_read(secured: Any, arun: Any) -> None:
    """``GET /health`` is open without a key; a body announced with it is refused, never buffered."""
    _, srv, _ = secured

    async def go() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.server.port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 8000000\r\n\r\n")
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        writer.close()
        return status

    assert arun(go()) == 400
