"""Minimal HTTP/1.1 over asyncio streams (stdlib only), shared by the engine server and its client.

Owns request/response framing with ``Content-Length`` bodies and keep-alive: enough for a JSON RPC
protocol between our own processes (or an SGLang server), without a web framework dependency; and
the JSON body and value checks every route shares (``parse_json``, ``is_int``, ``is_num``).
Chunked transfer encoding is not supported (the server answers 411). Slow clients: with
``idle_timeout_s`` a connection that sends nothing for that long between requests is closed without
an answer (a keep-alive client reconnects); with ``timeout_s`` a request whose first byte arrived
must be complete (request line, headers, body) within that many seconds, else 408 and the
connection is closed, so a client trickling bytes (slowloris) cannot hold a connection open.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

MAX_HEADER_LINE = 16 * 1024
MAX_HEADERS = 100
DRAIN_REFUSED_BODY = 64 * 1024
"""A refused request's body up to this size is read and dropped, so that closing the connection
does not reset it before the client reads the answer; a larger one is not read at all."""


class HTTPError(Exception):
    """A request the server rejects with ``status`` (4xx) and a message for the client."""

    def __init__(self, status: int, message: str, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close


@dataclass
class Request:
    method: str
    path: str
    version: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    @property
    def keep_alive(self) -> bool:
        conn = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return conn == "keep-alive"
        return conn != "close"


async def _read_line(reader: asyncio.StreamReader) -> bytes:
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise HTTPError(431, "request line or header too long", close=True) from None
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise HTTPError(400, "incomplete request line", close=True) from None
        raise
    if len(line) > MAX_HEADER_LINE:
        raise HTTPError(431, "request line or header too long", close=True)
    return line


async def read_request(
    reader: asyncio.StreamReader,
    max_body: int,
    authorize: Callable[[str, str, dict[str, str]], bool] | None = None,
    *,
    idle_timeout_s: float | None = None,
    timeout_s: float | None = None,
) -> Request | None:
    """Read one request; None on a clean EOF between requests, or after ``idle_timeout_s`` without a
    byte. Raises ``HTTPError`` for bad framing, 401 when ``authorize(method, path, headers)`` says no
    (checked before the body is read), and 408 when the request is not complete ``timeout_s`` after
    its first byte (None: no limit)."""
    try:
        first = await asyncio.wait_for(reader.readexactly(1), idle_timeout_s)
    except (asyncio.IncompleteReadError, asyncio.TimeoutError):
        return None
    try:
        return await asyncio.wait_for(_read_rest(reader, first, max_body, authorize), timeout_s)
    except asyncio.TimeoutError:
        raise HTTPError(408, f"request not complete within {timeout_s:g} s of its first byte", close=True) from None


async def _read_rest(
    reader: asyncio.StreamReader,
    first: bytes,
    max_body: int,
    authorize: Callable[[str, str, dict[str, str]], bool] | None,
) -> Request | None:
    """``read_request`` after the first byte (``first``) arrived."""
    try:
        line = first if first == b"\n" else first + await _read_line(reader)
    except asyncio.IncompleteReadError:
        raise HTTPError(400, "incomplete request line", close=True) from None
    while line in (b"\r\n", b"\n"):  # tolerate stray blank lines between requests
        try:
            line = await _read_line(reader)
        except asyncio.IncompleteReadError:
            return None
    parts = line.decode("latin-1").strip().split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise HTTPError(400, f"malformed request line: {line[:80]!r}", close=True)
    method, target, version = parts
    headers: dict[str, str] = {}
    while True:
        try:
            h = await _read_line(reader)
        except asyncio.IncompleteReadError:
            raise HTTPError(400, "incomplete headers", close=True) from None
        if h in (b"\r\n", b"\n"):
            break
        if len(headers) >= MAX_HEADERS:
            raise HTTPError(431, "too many headers", close=True)
        name, sep, value = h.decode("latin-1").partition(":")
        if not sep:
            raise HTTPError(400, f"malformed header line: {h[:80]!r}", close=True)
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise HTTPError(411, "chunked transfer encoding is not supported; send Content-Length", close=True)
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        raise HTTPError(400, "invalid Content-Length", close=True) from None
    if length < 0:
        raise HTTPError(400, "invalid Content-Length", close=True)
    path = target.split("?", 1)[0]
    if method.upper() in ("GET", "HEAD") and length > 0:  # nothing here reads one: never buffer it
        raise HTTPError(400, f"a {method.upper()} request carries no body (Content-Length {length})", close=True)
    if authorize is not None and not authorize(method.upper(), path, headers):
        if 0 < length <= DRAIN_REFUSED_BODY:
            await reader.readexactly(length)
        raise HTTPError(401, "missing or invalid API key (send 'Authorization: Bearer <key>')", close=True)
    if length > max_body:
        raise HTTPError(413, f"request body of {length} bytes exceeds the limit of {max_body}", close=True)
    try:
        body = await reader.readexactly(length) if length else b""
    except asyncio.IncompleteReadError:
        raise HTTPError(400, "request body shorter than Content-Length", close=True) from None
    return Request(method.upper(), path, version, headers, body)


def _header_lines(headers: dict[str, str] | None) -> str:
    return "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())


def encode_response(status: int, payload: Any, keep_alive: bool, headers: dict[str, str] | None = None) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Status"
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{_header_lines(headers)}"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    return head.encode("latin-1") + body


def encode_request(
    method: str, path: str, host: str, payload: Any | None, headers: dict[str, str] | None = None
) -> bytes:
    body = b"" if payload is None else json.dumps(payload, separators=(",", ":")).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: keep-alive\r\n{_header_lines(headers)}"
    head += f"Content-Length: {len(body)}\r\n"
    if payload is not None:
        head += "Content-Type: application/json\r\n"
    return (head + "\r\n").encode("latin-1") + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """Read one response: (status, headers, body)."""
    line = await reader.readuntil(b"\n")
    parts = line.decode("latin-1").split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise ConnectionError(f"malformed status line {line[:80]!r}")
    status = int(parts[1])
    headers: dict[str, str] = {}
    while True:
        h = await reader.readuntil(b"\n")
        if h in (b"\r\n", b"\n"):
            break
        name, _, value = h.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await reader.readexactly(length) if length else b""
    return status, headers, body


def parse_json(body: bytes) -> Any:
    """A request body as JSON (None when empty); 400 when malformed."""
    if not body:
        return None
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HTTPError(400, f"malformed JSON body: {e}") from None


def is_int(v: Any) -> bool:
    """An int that is not a bool (JSON true/false must not pass as 1/0)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
    """An int or float that is not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)
