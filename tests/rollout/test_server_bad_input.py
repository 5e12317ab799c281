"""The engine server against slow clients, invalid UTF-8 and huge bodies (issue 14 item 6): each gets
a 4xx (or, idle, a closed connection) while other clients go on being served."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from asyncrl.models import stop_token_ids
from asyncrl.rollout.engine import LocalEngine
from asyncrl.rollout.remote import RemoteEngine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.server import ServerThread
from tests.rollout.test_server import post, raw_http


@pytest.fixture
def quick(load_tiny: Any, tmp_path: Any) -> Any:
    """A server with short limits: a request must be complete 0.5 s after its first byte; idle 1 s."""
    model, tok = load_tiny()
    eng = LocalEngine(model, tok, max_slots=8, max_seq_len=64)
    srv = ServerThread(eng, eos_ids=stop_token_ids(tok, model), request_timeout_s=0.5, idle_timeout_s=1.0)
    yield srv
    srv.stop()
    eng.close()


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, Any]]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(next(h for h in head.decode().split("\r\n") if h.lower().startswith("content-length")).split(":")[1])
    return int(head.split()[1]), json.loads(await reader.readexactly(length))


async def _still_serves(port: int) -> int:
    remote = RemoteEngine(f"http://127.0.0.1:{port}")
    try:
        (c,) = await remote.generate([5, 6], SamplingParams(max_new_tokens=2))
        return len(c.output_ids)
    finally:
        remote.close()


@pytest.mark.parametrize(
    "sent",
    [
        b"POST /generate HTTP/1.1\r\nHost: x\r\n",  # headers never finished
        b'POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"input_ids": ',  # body never finished
        b"P",  # one byte of a request line
    ],
    ids=["headers", "body", "request-line"],
)
def test_a_stalled_request_gets_408_and_others_are_served(quick: Any, arun: Any, sent: bytes) -> None:
    async def go() -> tuple[int, dict[str, Any], float, int, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", quick.server.port)
        writer.write(sent)
        await writer.drain()
        t0 = time.perf_counter()
        served = await _still_serves(quick.server.port)  # while the slow one holds its connection
        status, body = await _answer(reader)
        waited = time.perf_counter() - t0
        rest = await reader.read()  # then the server closes the connection
        writer.close()
        return status, body, waited, served, rest

    status, body, waited, served, rest = arun(go())
    assert status == 408 and body["code"] == 408
    assert body["message"] == "request not complete within 0.5 s of its first byte"
    assert waited < 20 and served == 2 and rest == b""  # a hang guard: the 408 comes at 0.5 s


def test_a_trickling_client_slowloris_is_cut_off(quick: Any, arun: Any) -> None:
    """One byte every 20 ms of a header that never ends: each read is quick, so only a deadline from the
    request's first byte (0.5 s here) cuts it off, while the client is still sending (counted, not timed;
    a deadline renewed by every read would answer only after the client gave up, 20 s later)."""

    async def go() -> tuple[int, bool, int]:
        reader, writer = await asyncio.open_connection("127.0.0.1", quick.server.port)
        t0 = time.perf_counter()
        writer.write(b"POST /generate HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        answer = asyncio.ensure_future(_answer(reader))
        cut_off = False
        while time.perf_counter() - t0 < 20:
            if answer.done():
                cut_off = True
                break
            try:
                writer.write(b"a")
                await writer.drain()
            except ConnectionError:
                cut_off = True
                break
            await asyncio.sleep(0.02)
        status, _ = await answer
        writer.close()
        return status, cut_off, quick.server.errors_5xx

    status, cut_off, errors_5xx = arun(go())
    assert status == 408 and cut_off and errors_5xx == 0


def test_an_idle_connection_is_closed_without_an_answer(quick: Any, arun: Any) -> None:
    async def go() -> tuple[bytes, float]:
        reader, writer = await asyncio.open_connection("127.0.0.1", quick.server.port)
        t0 = time.perf_counter()
        data = await asyncio.wait_for(reader.read(), 25)
        writer.close()
        return data, time.perf_counter() - t0

    data, elapsed = arun(go())
    assert data == b"" and 0.8 < elapsed < 20  # closed after idle_timeout_s = 1, no stale answer left behind


def test_a_pooled_client_reconnects_after_the_idle_close(quick: Any, arun: Any) -> None:
    async def go() -> list[int]:
        remote = RemoteEngine(quick.url)
        out = []
        for pause in (0.0, 3.0):  # the second request finds its pooled connection closed by the server
            await asyncio.sleep(pause)
            (c,) = await remote.generate([5, 6], SamplingParams(max_new_tokens=2))
            out.append(len(c.output_ids))
        remote.close()
        return out

    assert arun(go()) == [2, 2]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b'{"input_ids": [1, 2], "text": "caf\xe9"}', 400, "malformed JSON body"),  # not UTF-8
        (b"\xff\xfe\x00\x00", 400, "malformed JSON body"),
        # valid JSON, not encodable: a lone surrogate
        (json.dumps({"text": "\ud800 x"}).encode(), 400, "'text' is not valid Unicode: a lone surrogate at character"),
        (b'{"input_ids": [' + b"1, " * 3_000_000 + b"1]}", 413, "body of 9000018 bytes exceeds the limit of 8388608"),
    ],
    ids=["latin-1", "utf-32-bom", "lone-surrogate", "9-MB-body"],
)
def test_invalid_utf8_and_huge_bodies_get_4xx(quick: Any, arun: Any, body: bytes, status: int, message: str) -> None:
    async def go() -> tuple[int, dict[str, Any], int]:
        request = post("/generate", body)
        if status == 413:  # answered from the headers, before the body: a client sending it all would be reset
            request = request[: request.index(b"\r\n\r\n") + 4]
        got, answer = await raw_http(quick.server.port, request)
        return got, answer, await _still_serves(quick.server.port)

    got, answer, served = arun(go())
    assert got == status and message in answer["message"] and served == 2
    assert quick.server.errors_5xx == 0
