"""The client of a reward server (``asyncrl serve reward``, :mod:`asyncrl.reward.remote`).

:class:`RemoteRewardClient` sends its calls through ``asyncrl.web.JsonClient``, the project's one HTTP
client: async ones on a keep-alive aiohttp session per event loop, sync ones (for code without an event
loop) on a loop of their own (``JsonClient.request_sync``).
Network errors and 5xx raise :class:`~asyncrl.reward.InfrastructureError` (retried by the service);
4xx raise ValueError. It sends the API key it is given, or else ``$ASYNCRL_API_KEY``. The reward
service uses it for ``remote:`` verifiers; it imports nothing of the server.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from asyncrl.auth import auth_headers, resolve_api_key
from asyncrl.reward import InfrastructureError
from asyncrl.web import JsonClient

__all__ = ["RemoteRewardClient"]


class RemoteRewardClient:
    """Client of a reward server: ``RemoteRewardClient("http://host:port#code")``.

    The ``#verifier`` fragment (optional) names the verifier the server should run; without it
    the server uses its default.
    """

    def __init__(self, url: str, *, timeout_s: float = 30.0, api_key: str | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"remote reward URL must be http(s)://host:port, got {url!r}")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.base_path = parts.path.rstrip("/")
        self.verifier = parts.fragment or None
        self.timeout_s = timeout_s
        self._headers = auth_headers(api_key or resolve_api_key())
        self._http = JsonClient(f"{parts.scheme}://{parts.netloc}{self.base_path}", self._headers)

    def _payload(self, response: str, reference: str, prompt: str, row: dict | None, verifier: str | None) -> bytes:
        body = {
            "verifier": verifier or self.verifier,
            "response": response,
            "reference": reference,
            "prompt": prompt,
            "row": row,
        }
        return json.dumps(body, default=str).encode()

    @staticmethod
    def _result(status: int, data: bytes, where: str) -> tuple[float, str | None]:
        try:
            body = json.loads(data.decode("utf-8")) if data else {}
        except (UnicodeDecodeError, json.JSONDecodeError):
            body = {"error": data[:200].decode("utf-8", "replace")}
        if status >= 500:
            raise InfrastructureError(f"reward server {where} answered {status}: {body.get('error')}")
        if status == 401:
            raise ValueError(f"reward server {where} answered 401: missing or wrong API key (set ASYNCRL_API_KEY)")
        if status != 200:
            raise ValueError(f"reward server {where} refused the request ({status}): {body.get('error')}")
        reward, failure = body.get("reward"), body.get("failure")
        if not isinstance(reward, (int, float)) or isinstance(reward, bool) or not math.isfinite(reward):
            raise InfrastructureError(f"reward server {where} sent a malformed reward {reward!r}")
        if failure is not None and not isinstance(failure, str):
            raise InfrastructureError(f"reward server {where} sent a malformed failure {failure!r}")
        return float(reward), failure

    async def score(
        self,
        response: str,
        reference: str,
        *,
        prompt: str = "",
        row: dict | None = None,
        verifier: str | None = None,
    ) -> tuple[float, str | None]:
        """POST /score; returns (reward, failure)."""
        status, data = await self._request("POST", "/score", self._payload(response, reference, prompt, row, verifier))
        return self._result(status, data, f"{self.host}:{self.port}")

    async def health(self) -> dict[str, Any]:
        status, data = await self._request("GET", "/health", None)
        if status != 200:
            raise InfrastructureError(f"reward server health check answered {status}")
        return json.loads(data.decode())

    async def _request(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        try:
            return await self._http.request(method, path, body, timeout=self.timeout_s)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            raise _unreachable(self.host, self.port, e) from e

    def score_sync(
        self,
        response: str,
        reference: str,
        *,
        prompt: str = "",
        row: dict | None = None,
        verifier: str | None = None,
    ) -> tuple[float, str | None]:
        """Blocking variant of :meth:`score` (``JsonClient.request_sync``: a loop of its own for the call)."""
        body = self._payload(response, reference, prompt, row, verifier)
        try:
            status, data = self._http.request_sync("POST", "/score", body, timeout=self.timeout_s)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            raise _unreachable(self.host, self.port, e) from e
        return self._result(status, data, f"{self.host}:{self.port}")

    async def close(self) -> None:
        """Close the pooled connections."""
        await self._http.aclose()


def _unreachable(host: str, port: int, e: BaseException) -> InfrastructureError:
    """A call that got no answer: the service retries it."""
    if isinstance(e, aiohttp.ClientConnectorError):
        return InfrastructureError(f"cannot reach reward server {host}:{port}: {e!r}")
    return InfrastructureError(f"reward server {host}:{port} connection failed: {e!r}")
