"""``JsonClient.call``: a JSON value out and the answer decoded back (empty: ``{}``; not JSON, e.g. a proxy's
error page: its first 200 characters as ``message``), and ``error_message``, what an error answer says."""

from __future__ import annotations

import asyncio
from typing import Any

from asyncrl.web.client import JsonClient, error_message


async def _serve(answers: dict[bytes, bytes]) -> tuple[asyncio.base_events.Server, list[bytes]]:
    """A raw HTTP server: a request whose line starts with a key of ``answers`` gets that response."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
        )
        seen.append(head.split(b"\r\n")[0] + b" " + await reader.readexactly(length))
        writer.write(next(resp for key, resp in answers.items() if head.startswith(key)))
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), seen


def _response(status: str, body: bytes, content_type: str = "application/json") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


def test_call_sends_json_and_decodes_every_kind_of_answer() -> None:
    page = b"<html>" + b"x" * 300 + b"</html>"
    answers = {
        b"POST /json": _response("200 OK", b'{"ok": [1, 2]}'),
        b"POST /empty": _response("200 OK", b""),
        b"GET /error": _response("400 Bad Request", b'{"message": "no such thing", "code": 7}'),
        b"GET /page": _response("502 Bad Gateway", page, "text/html"),
    }

    async def go() -> tuple[list[tuple[int, Any]], list[bytes]]:
        server, seen = await _serve(answers)
        client = JsonClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", {})
        try:
            out = [
                await client.call("POST", "/json", {"a": [1, "b"]}, timeout=10),
                await client.call("POST", "/empty", {}, timeout=10),
                await client.call("GET", "/error", timeout=10),
                await client.call("GET", "/page", timeout=10),
            ]
        finally:
            await client.aclose()
            server.close()
        return out, seen

    out, seen = asyncio.run(go())
    assert seen[0] == b'POST /json HTTP/1.1 {"a":[1,"b"]}'  # compact JSON
    assert seen[2] == b"GET /error HTTP/1.1 "  # no body
    assert out[0] == (200, {"ok": [1, 2]})
    assert out[1] == (200, {})
    assert out[2] == (400, {"message": "no such thing", "code": 7})
    assert out[3] == (502, {"message": page[:200].decode()})
    assert [error_message(answer) for _, answer in out[2:]] == ["no such thing", page[:200].decode()]
    assert error_message(["a list"]) == ["a list"]
    assert error_message({"detail": "x"}) == {"detail": "x"}
