"""API-key authentication and path confinement shared by the engine and reward HTTP servers.

The servers' one HTTP stack, ``asyncrl.web``, checks each request with :class:`ApiKeyAuth` before
it reads the body; the servers call :func:`check_bind` and :func:`confine_path`. Standard library
only; imports no sibling (like ``types`` and ``config``).

- The key is a bearer token (``Authorization: Bearer <key>``, as SGLang's and vLLM's
  ``--api-key``). :func:`resolve_api_key` takes it from an option, a file, or the environment
  variable ``ASYNCRL_API_KEY`` (which keeps it out of process listings).
- :func:`check_bind` refuses a server bound beyond loopback without a key.
- :class:`ApiKeyAuth` decides each request (``hmac.compare_digest``); refusals are logged with
  method, path and peer (never the key), at most ``LOG_BURST`` lines a minute.
- ``GET /health`` stays open (load balancers and probes send no key); it must answer
  ``{"status": "ok"}`` and nothing else, and do nothing (see docs/security.md).
- :func:`confine_path` resolves a client-given path (symlinks, ``..``) and refuses anything
  outside a root directory (the run's weight-export directory).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import secrets
import socket
import threading
import time
from pathlib import Path

__all__ = [
    "API_KEY_ENV",
    "OPEN_ROUTES",
    "ApiKeyAuth",
    "InsecureBindError",
    "PathOutsideRoot",
    "auth_headers",
    "check_bind",
    "confine_path",
    "is_loopback",
    "new_api_key",
    "peer_name",
    "resolve_api_key",
]

logger = logging.getLogger(__name__)

API_KEY_ENV = "ASYNCRL_API_KEY"
OPEN_ROUTES = frozenset({("GET", "/health")})
"""Routes answered without the key: liveness only, ``{"status": "ok"}``, no side effect."""
LOG_BURST = 20
"""Refusals logged per minute at most (the rest are counted and summarised)."""


class InsecureBindError(ValueError):
    """A server asked to listen beyond loopback without an API key."""


class PathOutsideRoot(PermissionError):
    """A client-given path that resolves outside the directory it is confined to."""


def new_api_key() -> str:
    """A fresh random key (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def resolve_api_key(explicit: str | None = None, key_file: str | None = None) -> str | None:
    """The key from ``explicit``, else the first line of ``key_file``, else ``$ASYNCRL_API_KEY``;
    None when none is set (an empty value counts as unset)."""
    if explicit:
        return explicit
    if key_file:
        try:
            key = Path(key_file).read_text(encoding="utf-8").strip().splitlines()
        except OSError as e:
            raise ValueError(f"cannot read the API key file {key_file}: {e.strerror or e}") from None
        if not key or not key[0].strip():
            raise ValueError(f"the API key file {key_file} is empty")
        return key[0].strip()
    return os.environ.get(API_KEY_ENV) or None


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The request header a client sends (none without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def is_loopback(host: str) -> bool:
    """True when every address ``host`` names is a loopback address ("" and 0.0.0.0 are not)."""
    if host in ("", "0.0.0.0", "::"):
        return False
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addrs = {info[4][0] for info in infos}
    return bool(addrs) and all(ipaddress.ip_address(a.split("%", 1)[0]).is_loopback for a in addrs)


def check_bind(host: str, has_key: bool, server: str) -> None:
    """Raise :class:`InsecureBindError` if ``server`` would listen beyond loopback without a key."""
    if has_key or is_loopback(host):
        return
    raise InsecureBindError(
        f"refusing to start the {server} on {host or 'all interfaces'} without an API key: anyone who "
        f"can reach it could drive it. Set {API_KEY_ENV} (or pass --api-key-file FILE), or bind to "
        "127.0.0.1. See docs/security.md."
    )


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


class ApiKeyAuth:
    """Per-request decision for one server: ``allows(method, path, authorization, peer)``.

    Without a key every request is allowed (loopback servers; see :func:`check_bind`).
    Thread-safe (the reward server decides in one thread per request)."""

    def __init__(self, api_key: str | None, server: str) -> None:
        self._key = api_key.encode("utf-8") if api_key else None
        self.server = server
        self.refused = 0
        self._lock = threading.Lock()
        self._window_start = 0.0
        self._logged = 0
        self._suppressed = 0

    @property
    def enabled(self) -> bool:
        return self._key is not None

    def valid(self, authorization: str | None) -> bool:
        """Whether the ``Authorization`` header carries the key (always True without a key)."""
        if self._key is None:
            return True
        token = _bearer(authorization)
        # compare_digest on equal-type bytes: the time taken does not depend on where they differ
        return token is not None and hmac.compare_digest(token.encode("utf-8", "surrogatepass"), self._key)

    def allows(self, method: str, path: str, authorization: str | None, peer: str) -> bool:
        """Decide one request; a refusal is counted and logged (rate-limited)."""
        if self._key is None or (method, path) in OPEN_ROUTES or self.valid(authorization):
            return True
        reason = "no API key" if _bearer(authorization) is None else "wrong API key"
        self._log_refusal(method, path, peer, reason)
        return False

    def _log_refusal(self, method: str, path: str, peer: str, reason: str) -> None:
        with self._lock:
            self.refused += 1
            now = time.monotonic()
            if now - self._window_start >= 60.0:
                if self._suppressed:
                    logger.warning("%s: %d more refused requests not logged", self.server, self._suppressed)
                self._window_start, self._logged, self._suppressed = now, 0, 0
            if self._logged >= LOG_BURST:
                self._suppressed += 1
                return
            self._logged += 1
        # %r: the method and path come from the network and may hold control characters
        logger.warning("%s: refused %r %r from %s (401: %s)", self.server, method[:16], path[:200], peer, reason)


def peer_name(peername: object) -> str:
    """``host:port`` of a socket's ``getpeername()`` (or ``?``)."""
    if isinstance(peername, tuple) and len(peername) >= 2:
        return f"{peername[0]}:{peername[1]}"
    return str(peername) if peername else "?"


def confine_path(path: str, root: str | Path) -> Path:
    """``path`` (relative paths are taken relative to ``root``) with symlinks and ``..`` resolved;
    raises :class:`PathOutsideRoot` if the result is not ``root`` or inside it."""
    if "\x00" in path:
        raise PathOutsideRoot("the path contains a NUL byte")
    real_root = Path(os.path.realpath(root))
    target = Path(os.path.realpath(os.path.join(real_root, path)))
    if target != real_root and real_root not in target.parents:
        raise PathOutsideRoot(
            f"{path!r} resolves to {str(target)!r}, outside this server's weights root {str(real_root)!r}"
        )
    return target
