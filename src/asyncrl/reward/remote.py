"""Rewards computed on another host: the ``asyncrl serve reward`` server.

Server (:class:`RewardServer`, :func:`serve_reward`): an ``asyncrl.web.JsonServer`` (an aiohttp
application; this module owns its route table, ``ROUTES``, and what each route answers) in front
of a :class:`~asyncrl.reward.service.RewardService`, both on one event loop in a background thread.
Loopback only unless told otherwise; beyond loopback it refuses to start without an API key
(``asyncrl.auth``, docs/security.md). With a key, every request but ``GET /health`` needs
``Authorization: Bearer <key>``; others get 401 (logged).

- ``POST /score`` with JSON ``{"verifier", "response", "reference", "prompt", "row"}`` (:class:`ScoreBody`:
  only ``response`` and ``reference`` are required; ``verifier`` defaults to the server's) answers
  ``{"reward", "failure", "latency_s", "cached"}``. ``failure`` has the service's meaning.
- ``GET /health`` answers ``{"status": "ok", "metrics": {...}}``; without the key (on a server
  that has one) only ``{"status": "ok"}``.
- Malformed input gets a 4xx with ``{"error": ...}``: bad JSON (invalid UTF-8 included) or fields
  400, unknown path 404, a body neither ``Content-Length`` nor chunked 411, body too large 413, a
  request not complete within ``read_timeout_s`` of its first byte (a slow client, slowloris) 408 and
  the connection closed; a connection idle that long is closed without an answer. ``remote:``
  verifiers are refused (no relaying), and ``custom:`` ones unless the server was started with
  ``allow_custom=True`` (it would import and run any importable function the client names). A
  handler error is a 500, never a dead server.

Its client is :class:`~asyncrl.reward.client.RemoteRewardClient` (``client.py``).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from asyncrl.auth import ApiKeyAuth, check_bind
from asyncrl.reward.service import RemoteTarget, RewardService, resolve_verifier
from asyncrl.web import HTTPError, JsonServer, Request, Route, parse_body

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024 * 1024
ROUTES = {("GET", "/health"): "health", ("POST", "/score"): "score"}
"""Every (method, path) the server answers (tests iterate over it)."""


@dataclass(frozen=True)
class ScoreBody:
    """A ``POST /score`` body (keys it does not name are ignored)."""

    unknown_fields: ClassVar[str] = "ignore"
    response: str
    reference: str
    verifier: str | None = None
    """None or empty: the server's default."""
    prompt: str | None = None
    row: dict[str, Any] | None = None


def _error(status: int, message: str) -> dict[str, Any]:
    return {"error": message}


def _not_found(method: str, path: str) -> HTTPError:
    return HTTPError(404, f"no such route {method} {path!r}; use GET /health or POST /score", close=True)


class RewardServer:
    """An HTTP reward server running in a background thread (``start()``/``close()``).

    The RewardService and the HTTP server share one event loop, on that thread."""

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
        self._service_args = dict(num_workers=num_workers, timeout_s=timeout_s, **service_kwargs)
        self.score_timeout_s = timeout_s + 60.0
        """How long one scoring may take (the service has its own timeouts inside it)."""
        self.read_timeout_s = read_timeout_s
        handlers = {"health": self._health, "score": self._score}
        self.http = JsonServer(
            "reward server",
            [Route(method, path, handlers[name]) for (method, path), name in ROUTES.items()],
            _error,
            self.auth,
            max_body_bytes=max_body_bytes,
            request_timeout_s=read_timeout_s,
            idle_timeout_s=read_timeout_s,
            backlog=1024,
            not_found=_not_found,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self.service: RewardService | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> RewardServer:
        """Start serving; raises ``auth.InsecureBindError`` beyond loopback without an API key."""
        check_bind(self.host, self.auth.enabled, "reward server")  # before anything starts
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._loop_thread = threading.Thread(target=loop.run_forever, name="asyncrl-reward-loop", daemon=True)
        self._loop_thread.start()

        async def make() -> int:
            self.service = RewardService(**self._service_args)  # starts no worker until a request needs one
            return await self.http.start(self.host, self.port)

        try:
            self.port = asyncio.run_coroutine_threadsafe(make(), loop).result()
        except BaseException:
            self.close()
            raise
        logger.info("reward server listening on %s", self.url)
        return self

    def close(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return

        async def stop() -> None:
            await self.http.stop()
            if self.service is not None:
                await self.service.close()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        if self._loop_thread is not None:
            self._loop_thread.join(timeout=10)
        loop.close()

    def __enter__(self) -> RewardServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _health(self, req: Request) -> dict[str, Any]:
        if self.auth.enabled and not self.auth.valid(req.headers.get("Authorization")):
            return {"status": "ok"}  # the open route: liveness only, nothing revealed
        return self.handle_health()

    async def _score(self, req: Request) -> dict[str, Any]:
        if not req.framed:
            raise HTTPError(411, "Content-Length (or a chunked body) is required", close=True)
        return await self.handle_score(req.json())

    async def handle_score(self, payload: Any) -> dict[str, Any]:
        body = parse_body(ScoreBody, payload)
        verifier, response, reference = body.verifier or self.default_verifier, body.response, body.reference
        prompt, row = body.prompt or "", body.row
        try:
            target = resolve_verifier(verifier)
        except ValueError as e:
            raise HTTPError(400, str(e)) from None
        if isinstance(target, RemoteTarget):
            raise HTTPError(400, "a reward server does not relay to another remote verifier")
        if verifier.startswith("custom:") and not self.allow_custom:
            raise HTTPError(403, "custom verifiers are disabled on this server (allow_custom=False)")
        assert self.service is not None
        coro = self.service.score(verifier, response, reference, prompt=prompt, row=row)
        result = await asyncio.wait_for(coro, self.score_timeout_s)
        return {
            "reward": result.reward,
            "failure": result.failure,
            "latency_s": result.latency_s,
            "cached": result.cached,
        }

    def handle_health(self) -> dict[str, Any]:
        assert self.service is not None
        return {"status": "ok", "metrics": self.service.metrics()}


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
