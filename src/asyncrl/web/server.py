"""The server side of asyncrl's HTTP stack: :class:`JsonServer`, an ``aiohttp.web.Application`` answering
JSON, shared by the engine server, its OpenAI-compatible door and the reward server.

Owns what those have in common, so that each of them holds only its route table and its shapes:

- Routing: each server hands a table of :class:`Route` (method, path pattern, handler); they go into
  the application's router (``app.router.add_route``; ``{name}`` segments reach the handler as
  ``Request.params``). An unknown path is 404, a known path with another method 405.
- Middlewares, outermost first: ``_answers`` turns what a handler returns into a 200 and what it raises
  into the server's error body (:class:`~asyncrl.web.checks.HTTPError`: its status; ``ValueError``:
  400, the engine's own validation; the router's 404/405; anything else 500, logged, and the server
  keeps serving), counting each answer; ``_auth`` checks the API key (``auth.ApiKeyAuth``: 401 with
  ``WWW-Authenticate: Bearer`` before the body is read, so an unknown path answers 401 too);
  ``_limits`` refuses a body on GET/HEAD (400) and a body over ``max_body_bytes`` (413: from
  ``Content-Length`` before reading, or while reading a chunked one), and reads the body within what is
  left of the request's deadline (``asyncio.timeout``; 408 and the connection closed past it).
- The deadline's head part, the half-close and malformed HTTP: :mod:`asyncrl.web.connection` (why it
  needs a protocol subclass is said there). Idle connections: aiohttp's own ``keepalive_timeout``.
- Every error body has the server's own shape (``error_body``: SGLang's, OpenAI's, the reward
  server's). Refusing to listen beyond loopback without a key is ``auth.check_bind``.
- Running a server from the command line until interrupted: :func:`serve_forever` (for anything that
  starts and stops like a :class:`JsonServer`: :class:`Serving`).

Imports ``auth`` and its own package only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Protocol

from aiohttp import web

from asyncrl.auth import ApiKeyAuth, check_bind, peer_name
from asyncrl.web.checks import HTTPError, dumps, parse_json
from asyncrl.web.connection import Connection

__all__ = ["JsonServer", "RawBody", "Request", "Route", "Serving", "Stream", "serve_forever"]

log = logging.getLogger(__name__)

MAX_HEADER_LINE = 16 * 1024
"""The longest request line or header line a server reads (aiohttp answers 400 past it)."""
LINGER_S = 2.0
"""A refused request's unread body is read and dropped for up to this long, so that closing the
connection does not reset it before the client has read the answer."""
SHUTDOWN_S = 1.0
"""On ``stop``, how long a request in progress may still finish before it is cancelled."""
UNAUTHORIZED = "missing or invalid API key (send 'Authorization: Bearer <key>')"
_BODY = web.RequestKey("asyncrl.body", bytes)


@dataclass(frozen=True)
class Request:
    """One request as a route's handler sees it: read whole, key checked."""

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
    params: Mapping[str, str] = field(default_factory=dict)
    """The route pattern's ``{name}`` segments."""

    def json(self) -> Any:
        """The body as JSON (None when empty); 400 when malformed."""
        return parse_json(self.body)


@dataclass(frozen=True)
class RawBody:
    """A handler's 200 answer that is not JSON (e.g. a protobuf message), sent as it is."""

    body: bytes
    content_type: str


@dataclass(frozen=True)
class Stream:
    """A handler's 200 answer sent piece by piece, as ``chunks`` yields them, through aiohttp's
    ``StreamResponse`` (server-sent events: ``text/event-stream``). Once the first piece is out the status
    is sent: an error raised by ``chunks`` afterwards is logged and ends the connection, and a client that
    goes away stops the iteration (``chunks`` is closed)."""

    chunks: AsyncGenerator[bytes, None]
    content_type: str = "text/event-stream"


Handler = Callable[[Request], Awaitable[Any]]
"""A route's handler: the payload of a 200 (JSON, or a :class:`RawBody`), or raises (see the module
docstring)."""


@dataclass(frozen=True)
class Route:
    """One entry of a server's route table."""

    method: str
    path: str
    """aiohttp's route pattern: a fixed path, or ``{name}`` segments (``/sessions/{session_id}/end``)."""
    handler: Handler


ErrorBody = Callable[..., Any]
"""``(status, message)`` -> the error's JSON body; also called ``(status, message, code)`` for an
``HTTPError`` with a ``code``."""
NotFound = Callable[[str, str], HTTPError]
"""``(method, path)`` -> the refusal of a request no route takes (the default: 404 ``no route PATH``)."""


class JsonServer:
    """One HTTP server answering JSON (see the module docstring); ``name`` appears in logs and errors.

    Counts its answers: ``served`` (2xx), ``errors_4xx``, ``errors_5xx``."""

    def __init__(
        self,
        name: str,
        routes: Iterable[Route],
        error_body: ErrorBody,
        auth: ApiKeyAuth,
        *,
        max_body_bytes: int,
        request_timeout_s: float,
        idle_timeout_s: float,
        backlog: int = 4096,
        not_found: NotFound | None = None,
        key_header: str | None = None,
    ) -> None:
        """``key_header``: a header that may carry the bare key instead of ``Authorization: Bearer``
        (the Tinker client's ``X-API-Key``)."""
        self.name = name
        self.key_header = key_header
        self.routes = tuple(routes)
        self.error_body = error_body
        self.auth = auth
        self.max_body_bytes = max_body_bytes
        self.request_timeout_s = request_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.backlog = backlog
        self.not_found = not_found or (lambda method, path: HTTPError(404, f"no route {path}"))
        self.port = 0
        self.served = 0
        self.errors_4xx = 0
        self.errors_5xx = 0
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.AbstractServer | None = None

    def application(self) -> web.Application:
        """A fresh application: the middlewares, then the route table in the router."""
        middlewares = [self._answers, self._auth, self._limits]
        app = web.Application(middlewares=middlewares, client_max_size=self.max_body_bytes)
        for route in self.routes:
            app.router.add_route(route.method, route.path, self._handler(route.handler))
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen; returns the bound port (``port=0`` picks a free one). Raises
        ``auth.InsecureBindError`` for a non-loopback ``host`` without an API key."""
        check_bind(host, self.auth.enabled, self.name)
        settings: dict[str, Any] = dict(
            keepalive_timeout=self.idle_timeout_s,
            access_log=None,
            lingering_time=LINGER_S,
            max_line_size=MAX_HEADER_LINE,
            max_field_size=MAX_HEADER_LINE,
        )
        runner = web.AppRunner(self.application(), shutdown_timeout=SHUTDOWN_S, **settings)
        await runner.setup()
        manager = runner.server
        assert manager is not None
        loop = asyncio.get_running_loop()
        try:
            listener = await loop.create_server(
                lambda: Connection(manager, self, loop=loop, **settings), host, port, backlog=self.backlog
            )
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._listener = runner, listener
        self.port = int(listener.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        """Stop listening and close every connection (a request still running after ``SHUTDOWN_S``
        is cancelled)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    # ------------------------------------------------------------------ answers
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
        resp = web.Response(body=dumps(payload), status=status, content_type="application/json", headers=headers)
        if close:
            resp.force_close()
        return resp

    def error_payload(self, status: int, message: str) -> Any:
        return self.error_body(status, message)

    def refusal(self, status: int, message: str) -> bytes:
        """A whole HTTP/1.1 error response that closes the connection, for a request that never got to
        a handler (its head never came in time)."""
        self.count(status)
        body = dumps(self.error_body(status, message))
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        return head.encode("latin-1") + body

    def late_message(self) -> str:
        return f"request not complete within {self.request_timeout_s:g} s of its first byte"

    def _error(self, e: HTTPError, headers: dict[str, str] | None = None) -> web.Response:
        args = (e.status, e.message) if e.code is None else (e.status, e.message, e.code)
        payload = self.error_body(*args)
        return self.answer(e.status, payload, close=e.close, headers=headers)

    def _handler(self, handler: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """A route's handler as aiohttp calls it: the request read by ``_limits``, the payload a 200."""

        async def handle(request: web.Request) -> web.StreamResponse:
            req = Request(
                request.method.upper(),
                request.rel_url.raw_path,
                request.headers,
                request[_BODY],
                _peer(request),
                _framed(request),
                dict(request.match_info),
            )
            payload = await handler(req)
            if isinstance(payload, Stream):
                return await self._stream(request, payload)
            if isinstance(payload, RawBody):
                self.count(200)
                return web.Response(body=payload.body, status=200, content_type=payload.content_type)
            return self.answer(200, payload)

        return handle

    async def _stream(self, request: web.Request, stream: Stream) -> web.StreamResponse:
        """``stream`` written as it comes (see :class:`Stream`), counted as a 200."""
        headers = {"Content-Type": stream.content_type, "Cache-Control": "no-cache"}
        resp = web.StreamResponse(status=200, headers=headers)
        await resp.prepare(request)
        self.count(200)
        try:
            async for chunk in stream.chunks:
                await resp.write(chunk)
            await resp.write_eof()
        except ConnectionError:
            resp.force_close()  # the client went away
        except Exception:
            log.exception("%s: %s %s failed while streaming", self.name, request.method, request.rel_url.raw_path)
            resp.force_close()
        finally:
            await stream.chunks.aclose()
        return resp

    # ------------------------------------------------------------------ middlewares
    @web.middleware
    async def _answers(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Every outcome an answer in the server's shape (module docstring)."""
        connection = request.protocol if isinstance(request.protocol, Connection) else None
        if connection is not None:
            connection.handler_started(request)
        try:
            return await handler(request)
        except HTTPError as e:
            return self._error(e, {"WWW-Authenticate": "Bearer"} if e.status == 401 else None)
        except web.HTTPException as e:  # the router's: no route takes this request
            path = request.rel_url.raw_path
            if e.status == 404:
                return self._error(self.not_found(request.method, path))
            if e.status == 405:
                return self._error(HTTPError(405, f"method {request.method} not allowed on {path}"))
            return self._error(HTTPError(e.status, e.text or e.reason, close=True))
        except ValueError as e:  # the engine's own validation (e.g. a prompt longer than its context)
            return self.answer(400, self.error_body(400, str(e)))
        except Exception as e:  # never let one request take the server down
            log.exception("%s: %s %s failed", self.name, request.method, request.rel_url.raw_path)
            return self.answer(500, self.error_body(500, f"{type(e).__name__}: {e}"))
        finally:
            if connection is not None:
                connection.handler_done()

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """The API key, before anything is read: 401 (the connection closed after it)."""
        authorization = request.headers.get("Authorization")
        if authorization is None and self.key_header is not None and request.headers.get(self.key_header):
            authorization = f"Bearer {request.headers[self.key_header]}"
        if not self.auth.allows(request.method.upper(), request.rel_url.raw_path, authorization, _peer(request)):
            raise HTTPError(401, UNAUTHORIZED, close=True)
        return await handler(request)

    @web.middleware
    async def _limits(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """A GET's body, the declared size, then the body within the request's deadline."""
        method, length = request.method.upper(), request.content_length
        connection = request.protocol if isinstance(request.protocol, Connection) else None
        try:
            if method in ("GET", "HEAD") and request.body_exists:  # nothing here reads one: never buffer it
                raise HTTPError(400, f"a {method} request carries no body (Content-Length {length})", close=True)
            if length is not None and length > self.max_body_bytes:
                raise HTTPError(
                    413, f"request body of {length} bytes exceeds the limit of {self.max_body_bytes}", close=True
                )
            body = b""
            if request.body_exists:
                if connection is not None and not connection.body_can_complete(request.content):
                    raise HTTPError(400, "the client closed its side before the body was complete", close=True)
                left = connection.deadline_left() if connection is not None else self.request_timeout_s
                try:
                    async with asyncio.timeout(max(left, 1e-3)):
                        body = await self._read_body(request)
                except TimeoutError:
                    raise HTTPError(408, self.late_message(), close=True) from None
        finally:
            if connection is not None:
                connection.request_read()
        request[_BODY] = body
        return await handler(request)

    async def _read_body(self, request: web.Request) -> bytes:
        chunks, size = [], 0
        try:
            async for chunk in request.content.iter_any():
                size += len(chunk)
                if size > self.max_body_bytes:
                    raise HTTPError(413, f"request body exceeds the limit of {self.max_body_bytes} bytes", close=True)
                chunks.append(chunk)
        except web.RequestPayloadError as e:
            raise HTTPError(400, f"malformed request body: {e}", close=True) from None
        except ConnectionError:  # the client left mid-body: nobody will read the answer
            raise HTTPError(400, "the connection closed before the body was complete", close=True) from None
        return b"".join(chunks)


class Serving(Protocol):
    """A server that listens on ``start`` (returning the bound port) until ``stop``: a :class:`JsonServer`,
    or one that owns one (the engine server, the training service)."""

    async def start(self, host: str, port: int) -> int: ...

    async def stop(self) -> None: ...


def serve_forever(server: Serving, host: str, port: int, banner: Callable[[int], str]) -> None:
    """Run ``server`` on a new event loop until interrupted (Ctrl-C), for ``asyncrl serve ...``: start it on
    ``host:port``, print ``banner(bound port)``, wait; ``server.stop()`` however the wait ends. Returns on an
    interrupt; an error starting it (a port in use, an insecure bind) is raised."""

    async def main() -> None:
        bound = await server.start(host, port)
        print(banner(bound), flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await server.stop()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass


def _peer(request: web.BaseRequest) -> str:
    transport = request.transport
    return peer_name(transport.get_extra_info("peername") if transport is not None else None)


def _framed(request: web.BaseRequest) -> bool:
    """Whether the client framed a body (``Content-Length`` or chunked)."""
    return request.content_length is not None or "chunked" in request.headers.get("Transfer-Encoding", "").lower()
