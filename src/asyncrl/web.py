"""HTTP for every asyncrl server and client, on aiohttp: one stack, shared by the engine server, its
OpenAI-compatible door, the reward server, ``RemoteEngine`` and ``RemoteRewardClient``.

Owns what those have in common, so that each of them holds only its routes and its shapes:

- :class:`JsonServer`: an aiohttp server (``aiohttp.web``'s low-level ``Server``) answering JSON. It
  checks the API key first (``auth.ApiKeyAuth``: 401 with ``WWW-Authenticate: Bearer`` before the body
  is read, so an unknown path answers 401 too), refuses a body on GET/HEAD (400) and a body over
  ``max_body_bytes`` (413: from ``Content-Length`` before reading, or while reading a chunked one),
  reads the body, and hands a :class:`Request` to the server's ``dispatch``. ``dispatch`` returns the
  payload of a 200 or raises :class:`HTTPError` (its status and message), ``ValueError`` (400: the
  engine's own validation) or anything else (500, logged; the server keeps serving). Every error body
  has the server's own shape (``error_body``: SGLang's, OpenAI's, the reward server's), malformed HTTP
  included (aiohttp's parser: 400). Refusing to listen beyond loopback without a key is ``auth.check_bind``.
- Slow clients, which aiohttp does not bound by itself (:class:`_Connection`): a request must be
  complete (request line, headers, body) within ``request_timeout_s`` of its first byte, else 408 and
  the connection is closed, however slowly its bytes trickle in (slowloris); a connection idle for
  ``idle_timeout_s`` (before its first request or between two) is closed without an answer. A client
  that half-closes gets the answer to a whole request, then the close; one that half-closes before its
  request is whole is closed at once, unanswered, and no handler sees the request.
- :class:`HTTPError`, :func:`parse_json`, :func:`is_int`, :func:`is_num`, :func:`is_finite`: the checks
  every route shares (JSON as Python reads it carries ``NaN`` and ``Infinity``: ``is_finite`` refuses them).
- The client side, :class:`asyncrl.web_client.JsonClient` (its own module for size; one unit with
  this one): one connection-pooled, keep-alive ``aiohttp.ClientSession`` per client object and event
  loop, closed with its loop at the latest; a request the server dropped before answering (it closed
  a pooled connection) is sent again once.

Imports ``auth`` only, so that both ``rollout`` and ``reward`` may use it (DESIGN §2).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import aiohttp
from aiohttp import web

from asyncrl.auth import ApiKeyAuth, check_bind, peer_name

__all__ = ["HTTPError", "JsonServer", "Request", "is_finite", "is_int", "is_num", "parse_json"]

log = logging.getLogger(__name__)

MAX_HEADER_LINE = 16 * 1024
"""The longest request line or header line a server reads (aiohttp answers 400 past it)."""
LINGER_S = 2.0
"""A refused request's unread body is read and dropped for up to this long, so that closing the
connection does not reset it before the client has read the answer."""
SHUTDOWN_S = 1.0
"""On ``stop``, how long a request in progress may still finish before it is cancelled."""
UNAUTHORIZED = "missing or invalid API key (send 'Authorization: Bearer <key>')"


class HTTPError(Exception):
    """A request the server rejects with ``status`` (4xx) and a message for the client; ``close``:
    close the connection after answering; ``code``: a machine-readable error code for the error body
    (e.g. OpenAI's ``model_not_found``), handed to ``error_body`` as its third argument when set."""

    def __init__(self, status: int, message: str, close: bool = False, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close
        self.code = code


@dataclass(frozen=True)
class Request:
    """One request as a server's ``dispatch`` sees it: read whole, key checked."""

    method: str
    """Upper-case."""
    path: str
    """As sent (not percent-decoded), without the query string."""
    headers: Mapping[str, str]
    """Case-insensitive."""
    body: bytes
    peer: str
    """``host:port`` of the client."""
    framed: bool
    """Whether the client framed a body (``Content-Length`` or chunked); an unframed request has none."""


Dispatch = Callable[[Request], Awaitable[Any]]
ErrorBody = Callable[..., Any]
"""``(status, message)`` -> the error's JSON body; also called ``(status, message, code)`` for an
``HTTPError`` with a ``code``."""


def parse_json(body: bytes) -> Any:
    """A request body as JSON (None when empty); 400 when malformed, nested too deeply for the parser, or
    holding an integer of more digits than Python reads (``sys.get_int_max_str_digits``)."""
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise HTTPError(400, f"malformed JSON body: {e}") from None
    except RecursionError:
        raise HTTPError(400, "malformed JSON body: nested too deeply") from None


def is_int(v: Any) -> bool:
    """An int that is not a bool (JSON true/false must not pass as 1/0)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
    """An int or float that is not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_finite(v: Any) -> bool:
    """A number (``is_num``) that is a finite float: not NaN, not infinite (``json.loads`` reads ``NaN``,
    ``Infinity``, ``1e999``), not an int too large for a float (``1`` and 400 zeros)."""
    if not is_num(v):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def _dumps(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


class JsonServer:
    """One HTTP server answering JSON (see the module docstring); ``name`` appears in logs and errors.

    Counts its answers: ``served`` (2xx), ``errors_4xx``, ``errors_5xx``."""

    def __init__(
        self,
        name: str,
        dispatch: Dispatch,
        error_body: ErrorBody,
        auth: ApiKeyAuth,
        *,
        max_body_bytes: int,
        request_timeout_s: float,
        idle_timeout_s: float,
        backlog: int = 4096,
    ) -> None:
        self.name = name
        self.dispatch = dispatch
        self.error_body = error_body
        self.auth = auth
        self.max_body_bytes = max_body_bytes
        self.request_timeout_s = request_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.backlog = backlog
        self.port = 0
        self.served = 0
        self.errors_4xx = 0
        self.errors_5xx = 0
        self._runner: web.ServerRunner | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen; returns the bound port (``port=0`` picks a free one). Raises
        ``auth.InsecureBindError`` for a non-loopback ``host`` without an API key."""
        check_bind(host, self.auth.enabled, self.name)
        server = _Server(
            self._serve, self, keepalive_timeout=self.idle_timeout_s, access_log=None, lingering_time=LINGER_S,
            max_line_size=MAX_HEADER_LINE, max_field_size=MAX_HEADER_LINE,
        )  # fmt: skip
        runner = web.ServerRunner(server, shutdown_timeout=SHUTDOWN_S)
        await runner.setup()
        site = web.TCPSite(runner, host, port, backlog=self.backlog)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        return self.port

    async def stop(self) -> None:
        """Stop listening and close every connection (a request still running after ``SHUTDOWN_S``
        is cancelled)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    def count(self, status: int) -> None:
        if status < 300:
            self.served += 1
        elif status < 500:
            self.errors_4xx += 1
        else:
            self.errors_5xx += 1

    def answer(
        self, status: int, payload: Any, *, close: bool = False, headers: dict[str, str] | None = None
    ) -> web.Response:
        """A JSON answer, counted; ``close``: the connection closes after it."""
        self.count(status)
        resp = web.Response(body=_dumps(payload), status=status, content_type="application/json", headers=headers)
        if close:
            resp.force_close()
        return resp

    def refusal(self, status: int, message: str) -> bytes:
        """A whole HTTP/1.1 error response that closes the connection, for a request that never got to
        a handler (its headers never came in time)."""
        self.count(status)
        body = _dumps(self.error_body(status, message))
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        return head.encode("latin-1") + body

    async def _serve(self, request: web.BaseRequest) -> web.StreamResponse:
        """One request: read and checked (``_read``), then dispatched; every exception is an answer."""
        connection = request.protocol
        try:
            req = await self._read(request, connection)
        except HTTPError as e:
            extra = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
            return self.answer(e.status, self._error_of(e), close=True, headers=extra)
        finally:
            if isinstance(connection, _Connection):
                connection.request_read()
        try:
            return self.answer(200, await self.dispatch(req))
        except HTTPError as e:
            return self.answer(e.status, self._error_of(e), close=e.close)
        except ValueError as e:  # the engine's own validation (e.g. a prompt longer than its context)
            return self.answer(400, self.error_body(400, str(e)))
        except Exception as e:  # never let one request take the server down
            log.exception("%s: %s %s failed", self.name, req.method, req.path)
            return self.answer(500, self.error_body(500, f"{type(e).__name__}: {e}"))

    def _error_of(self, e: HTTPError) -> Any:
        return self.error_body(e.status, e.message) if e.code is None else self.error_body(e.status, e.message, e.code)

    async def _read(self, request: web.BaseRequest, connection: object) -> Request:
        """The checks in their order (a GET's body, the key, the declared size), then the body, within
        the request's deadline."""
        method, path = request.method.upper(), request.rel_url.raw_path
        transport = request.transport
        peer = peer_name(transport.get_extra_info("peername") if transport is not None else None)
        length = request.content_length
        if method in ("GET", "HEAD") and request.body_exists:  # nothing here reads one: never buffer it
            raise HTTPError(400, f"a {method} request carries no body (Content-Length {length})")
        if not self.auth.allows(method, path, request.headers.get("Authorization"), peer):
            raise HTTPError(401, UNAUTHORIZED)
        if length is not None and length > self.max_body_bytes:
            raise HTTPError(413, f"request body of {length} bytes exceeds the limit of {self.max_body_bytes}")
        body = b""
        if request.body_exists:
            if isinstance(connection, _Connection) and not connection.body_can_complete(request.content):
                raise HTTPError(400, "the client closed its side before the body was complete")
            started = connection.request_started if isinstance(connection, _Connection) else None
            left = self.request_timeout_s if started is None else started + self.request_timeout_s - _now()
            try:
                body = await asyncio.wait_for(self._read_body(request), max(left, 1e-3))
            except asyncio.TimeoutError:
                raise HTTPError(408, self.late_message()) from None
        framed = length is not None or "chunked" in request.headers.get("Transfer-Encoding", "").lower()
        return Request(method, path, request.headers, body, peer, framed)

    async def _read_body(self, request: web.BaseRequest) -> bytes:
        chunks, size = [], 0
        try:
            async for chunk in request.content.iter_any():
                size += len(chunk)
                if size > self.max_body_bytes:
                    raise HTTPError(413, f"request body exceeds the limit of {self.max_body_bytes} bytes")
                chunks.append(chunk)
        except web.RequestPayloadError as e:
            raise HTTPError(400, f"malformed request body: {e}") from None
        except ConnectionError:  # the client left mid-body: nobody will read the answer
            raise HTTPError(400, "the connection closed before the body was complete") from None
        return b"".join(chunks)

    def late_message(self) -> str:
        return f"request not complete within {self.request_timeout_s:g} s of its first byte"


def _now() -> float:
    return asyncio.get_running_loop().time()


class _Connection(web.RequestHandler):
    """aiohttp's connection protocol, plus the two deadlines it lacks (module docstring) and error
    answers in the server's JSON shape. A request's deadline starts at its first byte
    (``data_received``) and ends when its handler has read its body (``request_read``)."""

    def __init__(self, manager: web.Server, owner: JsonServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.owner = owner
        self.request_started: float | None = None
        self.client_done = False
        """The client half-closed: it sends nothing more."""
        self._body: aiohttp.StreamReader | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm(self.owner.idle_timeout_s, self._idle)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._arm(None, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if data and self.request_started is None:  # the first byte of a request
            self.request_started = _now()
            self.keep_alive(True)  # stops aiohttp's idle timer: this request has its own deadline
            self._arm(self.owner.request_timeout_s, self._late)
        super().data_received(data)

    def eof_received(self) -> bool:
        """The client is done sending (a half-close). A whole request: answer it, then close (asyncio
        would otherwise close the transport now, before the answer). Nothing asked, or a request cut
        short (its headers or its body still coming): close now, unanswered; a body being read fails
        at once (aiohttp's ``connection_lost``) instead of waiting out the deadline, and a body not yet
        being read is refused when its handler starts (:meth:`body_can_complete`)."""
        self.client_done = True
        if self._waiting_for_a_request() or (self._body is not None and not self._body.is_eof()):
            self.force_close()
            return False
        self.close()  # aiohttp's: no further request, the connection closes after this answer
        return True

    def body_can_complete(self, body: aiohttp.StreamReader) -> bool:
        """Whether ``body``, which the handler is about to read, may still arrive whole: not when the
        client half-closed before it did (then the connection is closed now). Until ``request_read``
        a half-close closes the connection (:meth:`eof_received`)."""
        if self.client_done and not body.is_eof():
            self.force_close()
            return False
        self._body = body
        return True

    def request_read(self) -> None:
        """The handler has the whole request (or refused it): what follows is not bounded here."""
        self.request_started = None
        self._body = None
        self._arm(None, None)

    def _arm(self, delay: float | None, callback: Callable[[], None] | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        if delay is not None and callback is not None:
            self._timer = asyncio.get_running_loop().call_later(delay, callback)

    def _waiting_for_a_request(self) -> bool:
        """No handler runs and nothing is being written: aiohttp waits for the next request (as its
        own keep-alive timer checks)."""
        return self._waiter is not None and not self._waiter.done()

    def _idle(self) -> None:
        self._timer = None
        if self.request_started is None and self._waiting_for_a_request():
            self.force_close()

    def _late(self) -> None:
        """The request is not complete in time. While its headers are still coming no handler exists:
        answer 408 here. Once it has one, the handler reads the body under the same deadline."""
        self._timer = None
        if self.request_started is None or not self._waiting_for_a_request() or self.transport is None:
            return
        self.transport.write(self.owner.refusal(408, self.owner.late_message()))
        self.force_close()

    def handle_error(
        self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        """A request aiohttp could not parse (400) or a handler failure aiohttp caught: the server's
        JSON error, and the connection closed."""
        self.request_read()
        if request.writer.output_size > 0:  # as aiohttp: an answer was started, nothing more to say
            raise ConnectionError("response already started, cannot send the error")
        log.debug("%s: malformed request from %s: %s", self.owner.name, request.remote, message or exc)
        text = message or (str(exc) if exc is not None else HTTPStatus(status).phrase)
        what = "malformed request" if status < 500 else "internal error"
        return self.owner.answer(status, self.owner.error_body(status, f"{what}: {text}"), close=True)


class _Server(web.Server):
    """aiohttp's low-level server, making :class:`_Connection` protocols."""

    def __init__(self, handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]], owner: JsonServer,
                 **handler_kwargs: Any) -> None:  # fmt: skip
        super().__init__(handler)
        self.owner = owner
        self.handler_kwargs = handler_kwargs

    def __call__(self) -> _Connection:
        return _Connection(self, self.owner, loop=asyncio.get_running_loop(), **self.handler_kwargs)
