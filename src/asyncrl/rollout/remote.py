"""``RemoteEngine``: the HTTP client of an engine server, with ``LocalEngine``'s interface.

Owns the client side of the SGLang-native protocol (see ``rollout.server``): the controller uses
it exactly as it uses ``LocalEngine`` (both are ``rollout.api.RolloutEngine``s; this one answers a
group at once: ``reports_each_sample`` is False). It speaks to ``asyncrl serve engine`` or to an
SGLang server; the request/response shapes follow SGLang's native API as of v0.4.6 - v0.5.x
(``/generate`` with ``input_ids``, ``sampling_params`` incl. ``n``, ``sampling_seed``,
``ignore_eos``, ``stop_token_ids``; ``return_logprob`` -> ``meta_info.output_token_logprobs``;
``/pause_generation`` with ``mode`` (v0.5.x; older servers ignore the body);
``/update_weights_from_disk`` with ``weight_version``).

Per-token versions: taken from ``meta_info.output_token_versions`` (our server stamps every token);
an SGLang server only reports ``meta_info.weight_version`` per response, which is stamped on all its
tokens: exact when the server aborts running requests on an update (pause mode "abort", the
AReaL flow), approximate otherwise. Requests always send ``ignore_eos: true`` with explicit
``stop_token_ids`` so that stopping matches ``LocalEngine`` (stop only at the given ids).

Transport: ``asyncrl.web.JsonClient``, one keep-alive ``aiohttp`` session per event loop (at most
``max_connections`` concurrent requests; more wait for a connection). A request whose pooled
connection the server closed before answering is sent once more on a fresh one. 4xx answers raise
``ValueError`` with the server's message (as ``LocalEngine`` does for bad input); other failures
raise ``RuntimeError``.

Authentication: every request carries ``Authorization: Bearer <api_key>`` when a key is given, or
else set in ``$ASYNCRL_API_KEY`` (see docs/security.md); a 401 raises ``PermissionError``.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aiohttp

from asyncrl.auth import API_KEY_ENV, auth_headers, resolve_api_key
from asyncrl.rollout.api import SampleDone, refuse_on_sample_done
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Completion, WeightUpdate
from asyncrl.web import JsonClient
from asyncrl.web.client import error_message

__all__ = ["RemoteEngine", "completion_from_sglang"]


def completion_from_sglang(item: dict[str, Any], prompt: Sequence[int], fallback_version: int) -> Completion:
    """Turn one SGLang-native ``/generate`` result into a ``Completion``."""
    meta = item.get("meta_info", {})
    pairs = meta.get("output_token_logprobs") or []
    ids = item.get("output_ids")
    if ids is None:
        ids = [int(p[1]) for p in pairs]
    lps = [float(p[0]) if p[0] is not None else float("nan") for p in pairs]
    if len(lps) != len(ids):
        raise RuntimeError(f"server returned {len(ids)} output ids but {len(lps)} log-probs")
    versions = meta.get("output_token_versions")
    if versions is None:
        try:
            v = int(meta.get("weight_version", fallback_version))
        except (TypeError, ValueError):
            v = fallback_version
        versions = [v] * len(ids)
    finish = meta.get("finish_reason") or {}
    kind = finish.get("type") if isinstance(finish, dict) else finish
    reason = {"stop": "stop", "length": "length", "abort": "abort"}.get(kind or "length", "abort")
    return Completion(
        prompt_ids=tuple(int(t) for t in prompt),
        output_ids=tuple(int(t) for t in ids),
        behav_logprobs=tuple(lps),
        versions=tuple(int(v) for v in versions),
        finish_reason=reason,  # type: ignore[arg-type]
        num_interruptions=int(meta.get("num_interruptions", 1 if reason == "abort" else 0)),
    )


class RemoteEngine:
    """Client of an engine server with ``LocalEngine``'s interface (see module docstring)."""

    def __init__(
        self,
        base_url: str,
        *,
        max_connections: int = 256,
        timeout_s: float | None = None,
        version: int = 0,
        api_key: str | None = None,
    ) -> None:
        url = urlparse(base_url if "://" in base_url else f"http://{base_url}")
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"RemoteEngine needs an http://host:port URL, got {base_url!r}")
        self.base_url = base_url
        self.host = url.hostname
        self.port = url.port or 80
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self._version = version
        self._headers = auth_headers(api_key or resolve_api_key())
        self._weights_root: str | None | bool = False  # False: not asked yet
        self._http = JsonClient(f"http://{url.netloc}", self._headers, max_connections=max_connections)
        self._stats = dict.fromkeys(
            ("requests", "generated_tokens", "errors", "http_s", "retries", "aborted_samples"), 0.0
        )
        self._server_counters: dict[str, float] = {}
        self._stats_task: asyncio.Task | None = None
        self._no_server_stats = False

    # ------------------------------------------------------------------------------ LocalEngine API
    @property
    def version(self) -> int:
        """Latest weight version this client has seen (from updates or responses)."""
        return self._version

    reports_each_sample = False
    """The server answers a group at once (``generate`` takes no ``on_sample_done``)."""

    def start(self) -> None:
        """Nothing to start (the server runs elsewhere); kept for interface parity."""

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling: SamplingParams,
        n: int = 1,
        on_sample_done: SampleDone | None = None,
    ) -> list[Completion]:
        refuse_on_sample_done(self, on_sample_done)
        prompt = [int(t) for t in input_ids]
        params: dict[str, Any] = {
            "max_new_tokens": sampling.max_new_tokens,
            "temperature": 0.0 if sampling.is_greedy else sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "stop_token_ids": list(sampling.stop_token_ids),
            "ignore_eos": True,
            "n": n,
        }
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed
        body = {"input_ids": prompt, "sampling_params": params, "return_logprob": True}
        result = await self._call("POST", "/generate", body, timeout=self.timeout_s)
        items = result if isinstance(result, list) else [result]
        if len(items) != n:
            raise RuntimeError(f"server returned {len(items)} results for n={n}")
        out = [completion_from_sglang(it, prompt, self._version) for it in items]
        for c in out:
            self._stats["generated_tokens"] += len(c.output_ids)
            self._stats["aborted_samples"] += c.finish_reason == "abort"
            if c.versions:
                self._version = max(self._version, c.max_version)
        return out

    async def update_weights(self, update: WeightUpdate) -> None:
        """Disk updates go straight to ``/update_weights_from_disk``; in-process tensors are written to
        a temporary safetensors dir first (the server must see this machine's filesystem). Adapter-only
        updates are refused (only ``LocalEngine`` holds adapters)."""
        if update.adapter is not None:
            raise ValueError("RemoteEngine takes full weight updates only (tensors or path), not adapter-only ones")
        if update.path is not None:
            await self._update_from_disk(update.path, update.version)
        else:
            from safetensors.torch import save_file

            root = await self._server_weights_root()
            with tempfile.TemporaryDirectory(prefix="asyncrl-weights-", dir=root) as tmp:
                tensors = {k: v.detach().contiguous().cpu() for k, v in (update.tensors or {}).items()}
                await asyncio.to_thread(save_file, tensors, str(Path(tmp) / "model.safetensors"))
                await self._update_from_disk(tmp, update.version)
        self._version = update.version

    async def pause(self) -> None:
        """Stop decoding; running requests keep their KV (SGLang mode "in_place")."""
        await self._call("POST", "/pause_generation", {"mode": "in_place"})

    async def resume(self) -> None:
        await self._call("POST", "/continue_generation", {})

    async def abort_all(self) -> int:
        """Abort the running requests (they return partial output) and keep decoding."""
        out = await self._call("POST", "/pause_generation", {"mode": "abort"})
        await self._call("POST", "/continue_generation", {})
        return int(out.get("aborted", 0)) if isinstance(out, dict) else 0

    def stats(self) -> dict[str, float]:
        """Client-side counters, overlaid with the newest numeric counters of the server's ``/stats``
        (our server reports the engine's: ``generated_tokens``, ``busy_s``, ...; an SGLang server has
        no such endpoint and the client's counters stand). Never blocks: called inside an event loop,
        it refreshes the server's counters in the background (``server_stats()`` fetches them now)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None and self._stats_task is None and not self._no_server_stats:
            self._stats_task = loop.create_task(self._refresh_server_stats())
        return {**self._stats, **self._server_counters}

    async def _refresh_server_stats(self) -> None:
        try:
            fresh = await self._call("GET", "/stats", None, timeout=10)
            self._server_counters = {
                k: float(v) for k, v in fresh.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            }
        except ValueError:  # 4xx: the server has no /stats (SGLang)
            self._no_server_stats = True
        except (RuntimeError, OSError):
            pass  # unreachable for now: keep the last counters
        finally:
            self._stats_task = None

    def close(self) -> None:
        """Release the pooled connections (inside their event loop the close ends in the background)."""
        self._stop_stats()
        self._http.close()

    async def aclose(self) -> None:
        """``close`` inside the event loop, waiting until the connections are closed."""
        self._stop_stats()
        await self._http.aclose()

    def _stop_stats(self) -> None:
        if self._stats_task is not None:
            self._stats_task.cancel()
            self._stats_task = None

    # ------------------------------------------------------------------------------ extras
    async def health(self) -> bool:
        try:
            await self._call("GET", "/health", None, timeout=10)
            return True
        except (RuntimeError, ValueError, OSError):
            return False

    async def model_info(self) -> dict[str, Any]:
        info = await self._call("GET", "/model_info", None)
        try:
            self._version = int(info.get("weight_version", self._version))
        except (TypeError, ValueError):
            pass
        return info

    async def server_stats(self) -> dict[str, Any]:
        return await self._call("GET", "/stats", None)

    async def _server_weights_root(self) -> str | None:
        """The directory the server loads weights from (ours reports it; None for SGLang)."""
        if self._weights_root is False:
            root = (await self.model_info()).get("weights_root")
            self._weights_root = root if isinstance(root, str) else None
        return self._weights_root if isinstance(self._weights_root, str) else None

    # ------------------------------------------------------------------------------ transport
    async def _update_from_disk(self, path: str, version: int) -> None:
        body = {"model_path": str(path), "weight_version": str(version)}
        out = await self._call("POST", "/update_weights_from_disk", body)
        if isinstance(out, dict) and out.get("success") is False:
            raise RuntimeError(f"update_weights_from_disk failed: {out.get('message')}")

    async def _call(self, method: str, path: str, body: Any, timeout: float | None = 60.0) -> Any:
        t0 = time.perf_counter()
        self._stats["requests"] += 1
        retries = self._http.retries
        try:
            status, payload = await self._http.call(method, path, body, timeout=timeout)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            self._stats["errors"] += 1
            if isinstance(e, aiohttp.ClientConnectorError):
                raise RuntimeError(f"cannot connect to engine server {self.base_url}: {e}") from e
            raise RuntimeError(f"{method} {path} on {self.base_url} failed: {e!r}") from e
        finally:
            self._stats["retries"] += self._http.retries - retries
        self._stats["http_s"] += time.perf_counter() - t0
        if status >= 400:
            self._stats["errors"] += 1
            msg = error_message(payload)
            if status == 401:
                how = "the wrong API key" if self._headers else f"no API key (set {API_KEY_ENV})"
                raise PermissionError(f"{method} {path} on {self.base_url}: HTTP 401 with {how}: {msg}")
            if 400 <= status < 500:
                raise ValueError(f"{method} {path}: HTTP {status}: {msg}")
            raise RuntimeError(f"{method} {path}: HTTP {status}: {msg}")
        return payload
