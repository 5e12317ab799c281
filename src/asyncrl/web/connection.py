"""One client connection of a :class:`~asyncrl.web.server.JsonServer`: the deadline on a request's head,
the half-close, and malformed HTTP answered in the server's JSON shape.

Why a subclass of ``aiohttp.web.RequestHandler`` (aiohttp's connection protocol) at all: every public
setting of aiohttp's server (``keepalive_timeout``, ``read_bufsize``, ``max_line_size``,
``max_field_size``, ``lingering_time``, an application's ``client_max_size`` and ``handler_args``) acts
either before a request's first byte or after its head is parsed; nothing bounds the time a client may
take to send the head itself, and middlewares only see a request once its head is whole. A client that
trickles a header a byte at a time (slowloris) would hold its connection for ever. So this class
overrides only methods of the public ``asyncio.Protocol`` interface, ``data_received`` (to note a
request's first byte and whether its head is complete: the blank line that ends it) and
``eof_received`` (a half-close), plus aiohttp's ``handle_error`` (the answer to a request its parser
refused; aiohttp's own answers HTML), and calls only public methods (``keep_alive``, ``close``,
``force_close``, ``transport``). It reads no private attribute of aiohttp. The body's share of the
deadline is the server's middleware's (``asyncio.timeout`` around reading ``request.content``).

- Deadline: a request must be complete (request line, headers, body) within ``request_timeout_s`` of its
  first byte. Its head not in by then: 408 written here and the connection closed, however slowly the
  bytes trickle in; once its head is in, the middleware reads the body under what is left of the same
  deadline. A request's first byte stops aiohttp's keep-alive timer (``keep_alive(True)``), which
  otherwise closes a connection idle for ``keepalive_timeout`` (the server's ``idle_timeout_s``: before
  its first request or between two) without an answer; aiohttp arms it again after each answer.
- Half-close: a client that half-closes gets the answer to a whole request, then the close; one that
  half-closes before its request is whole is closed at once, unanswered, and no handler sees it.

Imports ``checks`` only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, Protocol

import aiohttp
from aiohttp import web

__all__ = ["Connection", "Owner"]

log = logging.getLogger(__name__)

_HEAD_END = b"\r\n\r\n"


class Owner(Protocol):
    """What a connection needs of its server."""

    name: str
    request_timeout_s: float

    def refusal(self, status: int, message: str) -> bytes: ...

    def late_message(self) -> str: ...

    def answer(
        self, status: int, payload: Any, *, close: bool = False, headers: dict[str, str] | None = None
    ) -> web.Response: ...

    def error_payload(self, status: int, message: str) -> Any: ...


class Connection(web.RequestHandler):
    """aiohttp's connection protocol plus the head deadline, the half-close and JSON answers to malformed
    HTTP (module docstring). The server's middleware tells it when a handler takes a request
    (:meth:`handler_started`), has read its body (:meth:`request_read`) and is done (:meth:`handler_done`)."""

    def __init__(self, manager: web.Server, owner: Owner, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.owner = owner
        self.request_started: float | None = None
        """Loop time of the first byte of the request being received (None: between requests)."""
        self.client_done = False
        """The client half-closed: it sends nothing more."""
        self._head_done = False
        self._tail = b""
        self._current: web.BaseRequest | None = None
        self._timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ asyncio.Protocol
    def data_received(self, data: bytes) -> None:
        if data and self.request_started is None:  # the first byte of a request
            self.request_started = _now()
            self._head_done, self._tail = False, b""
            self.keep_alive(True)  # stops aiohttp's idle timer: this request has its own deadline
            self._arm(self.owner.request_timeout_s, self._late)
        if data and not self._head_done:
            seen = self._tail + data
            self._head_done = _HEAD_END in seen
            self._tail = seen[-(len(_HEAD_END) - 1) :]
        super().data_received(data)

    def eof_received(self) -> bool:
        """The client is done sending (a half-close). A whole request: answer it, then close (asyncio
        would otherwise close the transport now, before the answer). Nothing asked, or a request cut
        short (its head or its body still coming): close now, unanswered; a body being read fails at
        once (aiohttp's ``connection_lost``) instead of waiting out the deadline, and a head whose
        handler has not started yet is refused when it does (:meth:`body_can_complete`)."""
        self.client_done = True
        current = self._current
        if current is not None:
            whole = current.content.is_eof()
        else:
            whole = self.request_started is not None and self._head_done
        if not whole:
            self.force_close()
            return False
        self.close()  # aiohttp's: no further request, the connection closes after this answer
        return True

    def connection_lost(self, exc: BaseException | None) -> None:
        self._arm(None, None)
        super().connection_lost(exc)

    # ------------------------------------------------------------------ told by the middleware
    def handler_started(self, request: web.BaseRequest) -> None:
        """A handler has ``request``: from now on the middleware bounds it."""
        self._current = request

    def body_can_complete(self, body: aiohttp.StreamReader) -> bool:
        """Whether ``body``, which the handler is about to read, may still arrive whole: not when the
        client half-closed before it did (then the connection is closed now)."""
        if self.client_done and not body.is_eof():
            self.force_close()
            return False
        return True

    def deadline_left(self) -> float:
        """Seconds left of the request's deadline (all of it when its first byte was not seen here)."""
        started = self.request_started
        return self.owner.request_timeout_s if started is None else started + self.owner.request_timeout_s - _now()

    def request_read(self) -> None:
        """The handler has the whole request (or refused it): what follows is not bounded here."""
        self.request_started = None
        self._arm(None, None)

    def handler_done(self) -> None:
        """The handler answered; the answer is being written."""
        self._current = None
        self.request_read()

    # ------------------------------------------------------------------ aiohttp's hook
    def handle_error(
        self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        """A request aiohttp could not parse (400) or a failure aiohttp caught: the server's JSON error,
        and the connection closed."""
        self.request_read()
        if request.writer.output_size > 0:  # as aiohttp: an answer was started, nothing more to say
            raise ConnectionError("response already started, cannot send the error")
        log.debug("%s: malformed request from %s: %s", self.owner.name, request.remote, message or exc)
        text = message or (str(exc) if exc is not None else HTTPStatus(status).phrase)
        what = "malformed request" if status < 500 else "internal error"
        return self.owner.answer(status, self.owner.error_payload(status, f"{what}: {text}"), close=True)

    # ------------------------------------------------------------------ the head's deadline
    def _arm(self, delay: float | None, callback: Callable[[], None] | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        if delay is not None and callback is not None:
            self._timer = asyncio.get_running_loop().call_later(delay, callback)

    def _late(self) -> None:
        """The request is not complete in time. While its head is still coming no handler exists: answer
        408 here. Once its head is in, its handler reads the body under the same deadline."""
        self._timer = None
        if self.request_started is None or self._head_done or self._current is not None or self.transport is None:
            return
        self.transport.write(self.owner.refusal(408, self.owner.late_message()))
        self.force_close()


def _now() -> float:
    return asyncio.get_running_loop().time()
