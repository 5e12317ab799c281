"""Rewards computed on another host: the ``asyncrl serve reward`` server.

Server (:class:`RewardServer`, :func:`serve_reward`): standard-library ``http.server`` in front of
a :class:`~asyncrl.reward.service.RewardService`. Loopback only unless told otherwise; beyond
loopback it refuses to start without an API key (``asyncrl.auth``, docs/security.md). With a key,
every request but ``GET /health`` needs ``Authorization: Bearer <key>``; others get 401 (logged).

- ``POST /score`` with JSON ``{"verifier", "response", "reference", "prompt", "row"}`` (only
  ``response`` and ``reference`` are required; ``verifier`` defaults to the server's) answers
  ``{"reward", "failure", "latency_s", "cached"}``. ``failure`` has the service's meaning.
- ``GET /health`` answers ``{"status": "ok", "metrics": {...}}``; without the key (on a server
  that has one) only ``{"status": "ok"}``.
- Malformed input gets a 4xx with ``{"error": ...}``: bad JSON (invalid UTF-8 included) or fields
  400, unknown path 404, missing length 411, body too large 413, a request not read within
  ``read_timeout_s`` (a slow client, slowloris; also a kept-alive connection left idle that long)
  408 and the connection closed (one watchdog thread, ``_Deadlines``, for the whole server);
  ``remote:`` verifiers are refused (no relaying), and
  ``custom:`` ones unless the server was started with ``allow_custom=True`` (it would import and
  run any importable function the client names). A handler error is a 500, never a dead server.

Its client is :class:`~asyncrl.reward.client.RemoteRewardClient` (``client.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from asyncrl.auth import ApiKeyAuth, check_bind, peer_name
from asyncrl.reward.service import RemoteTarget, RewardService, resolve_verifier

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024 * 1024
ROUTES = {("GET", "/health"): "health", ("POST", "/score"): "score"}
"""Every (method, path) the server answers (tests iterate over it)."""


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Deadlines:
    """One thread that answers 408 and closes the connections whose request was not read in time."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._due: dict[int, tuple[float, Callable[[], None]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="asyncrl-reward-deadlines", daemon=True)
        self._thread.start()

    def arm(self, key: int, on_expire: Callable[[], None]) -> None:
        with self._lock:
            self._due[key] = (time.monotonic() + self.timeout_s, on_expire)

    def disarm(self, key: int) -> None:
        with self._lock:
            self._due.pop(key, None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(min(0.2, self.timeout_s / 4)):
            now = time.monotonic()
            with self._lock:
                late = [key for key, (due, _) in self._due.items() if due <= now]
                calls = [self._due.pop(key)[1] for key in late]
            for call in calls:
                call()


class RewardServer:
    """An HTTP reward server running in background threads (``start()``/``close()``).

    The RewardService lives on its own event loop thread; each HTTP request is handled in a
    thread that submits to that loop and waits for the result.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        num_workers: int = 2,
        timeout_s: float = 10.0,
        *,
        default_verifier: str = "math",
        allow_custom: bool = False,
        max_body_bytes: int = MAX_BODY_BYTES,
        api_key: str | None = None,
        read_timeout_s: float = 30.0,
        **service_kwargs: Any,
    ) -> None:
        resolve_verifier(default_verifier)
        self.auth = ApiKeyAuth(api_key, "reward server")
        self.host = host
        self.port = port
        self.default_verifier = default_verifier
        self.allow_custom = allow_custom
        self.max_body_bytes = max_body_bytes
        self._service_args = dict(num_workers=num_workers, timeout_s=timeout_s, **service_kwargs)
        self.request_timeout_s = timeout_s + 60.0
        self.read_timeout_s = read_timeout_s
        self.deadlines: _Deadlines | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._http: ThreadingHTTPServer | None = None
        self._http_thread: threading.Thread | None = None
        self.service: RewardService | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> RewardServer:
        """Start serving; raises ``auth.InsecureBindError`` beyond loopback without an API key."""
        check_bind(self.host, self.auth.enabled, "reward server")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._loop_thread = threading.Thread(target=loop.run_forever, name="asyncrl-reward-loop", daemon=True)
        self._loop_thread.start()

        async def make() -> RewardService:
            return RewardService(**self._service_args)

        self.service = asyncio.run_coroutine_threadsafe(make(), loop).result()
        self.deadlines = _Deadlines(self.read_timeout_s)
        self._http = ThreadingHTTPServer((self.host, self.port), _make_handler(self))
        self._http.daemon_threads = True
        self.port = self._http.server_address[1]
        self._http_thread = threading.Thread(
            target=self._http.serve_forever, name="asyncrl-reward-http", daemon=True
        )
        self._http_thread.start()
        logger.info("reward server listening on %s", self.url)
        return self

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self.deadlines is not None:
            self.deadlines.close()
            self.deadlines = None
        if self._loop is not None:
            if self.service is not None:
                asyncio.run_coroutine_threadsafe(self.service.close(), self._loop).result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._loop_thread is not None:
                self._loop_thread.join(timeout=10)
            self._loop.close()
            self._loop = None

    def __enter__(self) -> RewardServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # called from HTTP handler threads
    def handle_score(self, payload: Any) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise _BadRequest(400, "the body must be a JSON object")
        verifier = payload.get("verifier") or self.default_verifier
        response, reference = payload.get("response"), payload.get("reference")
        prompt, row = payload.get("prompt") or "", payload.get("row")
        if not isinstance(verifier, str):
            raise _BadRequest(400, "verifier must be a string")
        if not isinstance(response, str) or not isinstance(reference, str):
            raise _BadRequest(400, "response and reference are required strings")
        if not isinstance(prompt, str):
            raise _BadRequest(400, "prompt must be a string")
        if row is not None and not isinstance(row, dict):
            raise _BadRequest(400, "row must be an object or null")
        try:
            target = resolve_verifier(verifier)
        except ValueError as e:
            raise _BadRequest(400, str(e)) from None
        if isinstance(target, RemoteTarget):
            raise _BadRequest(400, "a reward server does not relay to another remote verifier")
        if verifier.startswith("custom:") and not self.allow_custom:
            raise _BadRequest(403, "custom verifiers are disabled on this server (allow_custom=False)")
        assert self.service is not None and self._loop is not None
        coro = self.service.score(verifier, response, reference, prompt=prompt, row=row)
        result = asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=self.request_timeout_s)
        return {
            "reward": result.reward,
            "failure": result.failure,
            "latency_s": result.latency_s,
            "cached": result.cached,
        }

    def handle_health(self) -> dict[str, Any]:
        assert self.service is not None and self._loop is not None
        service = self.service

        async def metrics() -> dict[str, float]:
            return service.metrics()

        return {"status": "ok", "metrics": asyncio.run_coroutine_threadsafe(metrics(), self._loop).result(10)}


class _Handler(BaseHTTPRequestHandler):
    """One request of a :class:`RewardServer` (``reward`` is set by :func:`_make_handler`)."""

    reward: RewardServer
    protocol_version = "HTTP/1.1"
    server_version = "asyncrl-reward/1"

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s " + format, self.address_string(), *args)

    _timed_out = False

    def handle_one_request(self) -> None:
        """One request, read (request line, headers, body) within the server's ``read_timeout_s``."""
        deadlines = self.reward.deadlines
        assert deadlines is not None
        self._timed_out = False
        deadlines.arm(id(self), self._expire)
        try:
            super().handle_one_request()
        except OSError:
            if not self._timed_out:
                raise
            self.close_connection = True  # the watchdog answered 408 and shut the socket
        finally:
            deadlines.disarm(id(self))

    def _request_read(self) -> None:
        """The whole request is in: what follows (scoring) is not bounded by ``read_timeout_s``."""
        assert self.reward.deadlines is not None
        self.reward.deadlines.disarm(id(self))

    def _expire(self) -> None:
        """(The watchdog thread) the request was not read in time: 408, then shut the connection."""
        self._timed_out = True
        self.close_connection = True
        data = json.dumps({"error": f"request not complete within {self.reward.read_timeout_s:g} s"}).encode()
        head = "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\n"
        try:
            self.connection.sendall(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
        except OSError:
            pass
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        if not self._timed_out:  # after a 408 the socket is shut: nothing more to say
            super().send_error(code, message, explain)

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        if self._timed_out:
            return
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _discard_body(self, length: int) -> None:
        """Read (up to 64 MiB of) a refused body, so the client gets our answer rather
        than a connection reset."""
        left = min(length, 64 * 1024 * 1024)
        while left > 0:
            chunk = self.rfile.read(min(left, 1 << 16))
            if not chunk:
                break
            left -= len(chunk)

    def _authorized(self, method: str) -> bool:
        """Check the key before anything else (the body is not read); 401 if it is wrong."""
        path = urlsplit(self.path).path
        peer = peer_name(self.client_address)
        if self.reward.auth.allows(method, path, self.headers.get("Authorization"), peer):
            return True
        self.close_connection = True
        length = self.headers.get("Content-Length", "")
        if length.isdigit() and int(length) <= 64 * 1024:
            self._discard_body(int(length))
        data = json.dumps({"error": "missing or invalid API key (send 'Authorization: Bearer <key>')"})
        self.send_response(401)
        self.send_header("WWW-Authenticate", "Bearer")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data.encode())
        return False

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        """Key first, then the route of ``ROUTES``; never let a request take the server down."""
        if not self._authorized(method):
            return
        if method == "GET":
            self._request_read()
        name = ROUTES.get((method, urlsplit(self.path).path))
        try:
            if name is None:
                raise _BadRequest(404, f"no such route {method} {self.path!r}; use GET /health or POST /score")
            self._reply(200, getattr(self, f"_route_{name}")())
        except _BadRequest as e:
            self.close_connection = True
            self._reply(e.status, {"error": str(e)})
        except Exception as e:  # noqa: BLE001
            logger.exception("reward request %s %r failed", method, self.path)
            self.close_connection = True
            self._reply(500, {"error": f"{type(e).__name__}: {e}"})

    def _route_health(self) -> dict[str, Any]:
        if self.reward.auth.enabled and not self.reward.auth.valid(self.headers.get("Authorization")):
            return {"status": "ok"}  # the open route: liveness only, nothing revealed
        return self.reward.handle_health()

    def _route_score(self) -> dict[str, Any]:
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            raise _BadRequest(411, "Content-Length is required")
        try:
            length = int(length_header)
        except ValueError:
            raise _BadRequest(400, "bad Content-Length") from None
        if length < 0:
            raise _BadRequest(400, "bad Content-Length")
        if length > self.reward.max_body_bytes:
            self._discard_body(length)
            raise _BadRequest(413, f"body over {self.reward.max_body_bytes} bytes")
        raw = self.rfile.read(length)
        self._request_read()
        if self._timed_out:
            raise _BadRequest(408, "request not complete in time")
        try:
            payload = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _BadRequest(400, f"invalid JSON: {e}") from None
        return self.reward.handle_score(payload)


def _make_handler(server: RewardServer) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (_Handler,), {"reward": server})


def serve_reward(
    host: str = "127.0.0.1",
    port: int = 0,
    num_workers: int = 2,
    timeout_s: float = 10.0,
    *,
    default_verifier: str = "math",
    allow_custom: bool = False,
    on_ready: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
    api_key: str | None = None,
    **service_kwargs: Any,
) -> None:
    """Run a reward server until SIGINT/SIGTERM (or ``stop`` is set). Blocking.

    Prints ``asyncrl reward server listening on http://HOST:PORT`` once ready (``port=0`` picks
    a free port) and calls ``on_ready(url)``. ``api_key``: see the module docstring. Extra keyword
    arguments go to RewardService (``max_retries``, ``cache_size``, ``code_timeout_s``, ...).
    """
    stop = stop or threading.Event()
    server = RewardServer(
        host,
        port,
        num_workers,
        timeout_s,
        default_verifier=default_verifier,
        allow_custom=allow_custom,
        api_key=api_key,
        **service_kwargs,
    ).start()
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        key = "required" if api_key else "off"
        print(f"asyncrl reward server listening on {server.url} (API key {key})", flush=True)
        if on_ready is not None:
            on_ready(server.url)
        while not stop.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.close()
