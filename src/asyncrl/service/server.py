"""Running the Tinker-compatible training service: on an event loop, in a thread, or from the CLI.

Owns :class:`TrainingServer` (a :class:`~asyncrl.service.core.TrainingService` behind a
:class:`~asyncrl.web.JsonServer` with the client's API-key header, ``X-API-Key``, checked on every
call), :class:`ServiceThread` (the server on its own loop in a daemon thread, for tests, benchmarks and
notebooks that drive it with the synchronous ``tinker`` client) and :func:`serve_training`, what
``asyncrl serve training`` runs.

The official client only sends keys that start with ``tml-``; a service started without a key accepts
any (on loopback only: :func:`asyncrl.auth.check_bind`), so a client still has to be given one.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from asyncrl.auth import ApiKeyAuth, check_bind
from asyncrl.models import ModelDirError
from asyncrl.service.core import TrainingService
from asyncrl.service.routes import error_body, not_found, routes
from asyncrl.service.sampling import EngineSpec
from asyncrl.web.server import JsonServer, serve_forever

__all__ = ["KEY_HEADER", "ServiceThread", "TrainingServer", "serve_training"]

KEY_HEADER = "X-API-Key"
"""The header the Tinker client sends its key in (``Authorization: Bearer`` is accepted too)."""
MAX_BODY_BYTES = 64 * 1024 * 1024
"""A forward_backward chunk is at most 5 MB as the client cuts them; a sample request far less."""


class TrainingServer:
    """The service and its HTTP server, on the caller's event loop."""

    def __init__(
        self,
        models: dict[str, Path],
        root: str | Path,
        *,
        api_key: str | None = None,
        engine: EngineSpec | None = None,
        poll_s: float = 5.0,
    ) -> None:
        self.service = TrainingService(models, root, engine=engine, poll_s=poll_s)
        self.http = JsonServer(
            "training service",
            routes(self.service),
            error_body,
            ApiKeyAuth(api_key, "training service"),
            max_body_bytes=MAX_BODY_BYTES,
            request_timeout_s=120.0,
            idle_timeout_s=120.0,
            not_found=not_found,
            key_header=KEY_HEADER,
        )

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        return await self.http.start(host, port)

    async def stop(self) -> None:
        await self.http.stop()
        await self.service.close()


class ServiceThread:
    """A :class:`TrainingServer` on its own event loop in a daemon thread; ``url`` is the client's
    ``base_url``. ``with ServiceThread(models, root) as srv: tinker.ServiceClient(base_url=srv.url, ...)``."""

    def __init__(
        self, models: dict[str, Path], root: str | Path, host: str = "127.0.0.1", port: int = 0, **kw: Any
    ) -> None:
        self.server = TrainingServer(models, root, **kw)
        self.host, self.port = host, port
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="asyncrl-training-service", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> ServiceThread:
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self.server.start(self.host, self.port), self.loop).result()
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()


def serve_training(
    models: dict[str, Path], root: str | Path, host: str, port: int, *, api_key: str | None, engine: EngineSpec
) -> None:
    """Serve until interrupted (``asyncrl serve training``)."""
    check_bind(host, bool(api_key), "training service")
    for name, directory in models.items():
        if not (Path(directory) / "config.json").is_file():
            raise ModelDirError(f"base model {name}: {directory} has no config.json (not a Hugging Face model)")
    server = TrainingServer(models, root, api_key=api_key, engine=engine)
    serve_forever(
        server,
        host,
        port,
        lambda bound: (
            f"asyncrl training service (Tinker-compatible): http://{host}:{bound} (base models: "
            f"{', '.join(models)}; checkpoints under {root}; API key {'required' if api_key else 'off'})"
        ),
    )
