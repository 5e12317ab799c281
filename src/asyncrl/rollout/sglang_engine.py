"""``SGLangEngine``: the ``rollout.backend=sglang`` engine, a ``RolloutEngine`` client of a running SGLang server.

Owns the mapping of the project's engine contract onto SGLang's native HTTP API. Every request and response
shape here is SGLang's own, read in its source (sglang 0.5.23; the table in docs/engine.md names the file and
class of each): ``GenerateReqInput`` and the generated contract ``sglang.api.v1.GenerateRequest`` for
``/generate``, the tokenizer manager's ``meta_info``, ``UpdateWeightFromDiskReqInput``,
``PauseGenerationReqInput``, ``ContinueGenerationReqInput``, ``AbortReq``, ``UpdateWeightVersionReqInput`` and
``/model_info``. Nothing of SGLang is imported: it is GPU-only, and the server runs elsewhere. What every
backend engine shares (state, counters, ``generate``'s checks and seeds, an update's check/pause/load/resume
order) is ``rollout.backend_engine.BackendEngine``'s; this module holds SGLang's calls and shapes.

- **Tokens in, tokens out.** Each sample of ``generate(input_ids, sampling, n)`` is one ``/generate`` request
  with ``input_ids`` and its own ``sampling_seed`` (``sampling.seed + i``, as ``LocalEngine`` numbers them;
  SGLang applies it only on a server started with ``--enable-deterministic-inference``). The ids come back as
  sampled (``output_ids``; each checked against the id of its log-prob entry), never re-tokenised. Stopping
  is the project's: ``ignore_eos`` and the request's ``stop_token_ids`` (the stop token is kept).
- **Behaviour log-probs** from ``return_logprob`` (``logprob_start_len=-1``: output tokens only):
  ``meta_info.output_token_logprobs`` entries ``[logprob, token_id, text]``. SGLang's sampler
  (``layers/sampler.py``, ``Sampler.forward``) returns ``log(softmax(logits / temperature))`` of the sampled
  token, taken before top-k/top-p truncation: the project's definition (``types.Completion``), so top-p and
  top-k are served exactly. Argmax requests (``temperature`` 0) get ``log_softmax(logits)``, at temperature 1:
  greedy requests at another temperature are refused (``ValueError``), as ``VLLMEngine`` refuses them. A
  server started with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` returns untempered log-probs: not supported.
- **Versions** are SGLang's: every response carries ``meta_info.weight_versions``, spans ``{version, start,
  end}`` over its output tokens recorded by the scheduler at each weight change (``utils/weight_versions.py``);
  they are read back per token (invariant 2: stamped by the engine). A server without spans (older than their
  introduction) is accepted in ``abort`` mode only, where no request lives across an update, and its tokens
  take the response's ``meta_info.weight_version``.
- **Weight updates** from the trainer's safetensors export on disk, which the server must be able to read (a
  shared filesystem): names and shapes are checked against the starting checkpoint's first (a bad update leaves
  weights and version as they were), then ``abort`` -> ``/pause_generation {"mode": "abort"}`` (running requests
  return with ``finish_reason`` abort and their partial output; ``interruptible.generate_group`` re-prefills
  prompt + partial output under the new weights: AReaL's mode), ``/update_weights_from_disk`` with
  ``flush_cache`` (no KV of old weights is reused), ``/continue_generation``. ``keep`` -> ``/pause_generation
  {"mode": "in_place"}`` (running requests stay with their KV cache), the update without ``flush_cache`` (the
  server refuses to flush with requests in place), continue: PipelineRL's mode. Every request names its
  version's prefix-cache namespace (``extra_key``; a request is not sent while an update runs), so a request sent
  after an update never starts from a prefix cached under older weights (in ``keep`` mode one already on its way
  when the update starts may, like the requests kept in place). The starting weights are loaded the same way
  before the first request (version ``version``), so the server decodes exactly the model the trainer starts
  from.
- ``pause``/``resume`` map onto ``/pause_generation {"mode": "in_place"}``/``/continue_generation``; ``abort_all``
  onto ``/abort_request {"abort_all": true}``.

Not built here: SGLang's NCCL path (``/init_weights_update_group``, ``/update_weights_from_distributed``), which
needs the trainer's side of the broadcast group.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aiohttp

from asyncrl.auth import auth_headers, resolve_api_key
from asyncrl.choices import InterruptMode
from asyncrl.rollout.backend_engine import (
    FINISH_REASONS,
    BackendEngine,
    backend_completion,
    check_update_shapes,
    checkpoint_shapes,
)
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Completion, WeightUpdate
from asyncrl.web import JsonClient
from asyncrl.web.client import error_message

__all__ = ["SGLANG_VERSION_READ", "SGLangEngine", "completion_from_generate"]

SGLANG_VERSION_READ = "0.5.23"
"""The SGLang release whose source the request and response shapes were read from."""

_PAUSE_MODE: dict[str, str] = {"abort": "abort", "keep": "in_place"}
"""The project's interrupt mode -> ``PauseGenerationReqInput.mode``."""


def completion_from_generate(item: Any, prompt: Sequence[int], *, version: int | None) -> Completion:
    """A ``Completion`` from one non-streamed ``/generate`` response of SGLang (``output_ids`` and ``meta_info``
    with ``output_token_logprobs``, ``finish_reason``, ``weight_versions``/``weight_version``).

    ``version``: None requires per-token spans (``meta_info.weight_versions``); an int allows a response without
    them, all its tokens then stamped with ``meta_info.weight_version``. Raises ``RuntimeError`` for a response
    that does not hold together (ids and log-prob entries disagree, spans that do not cover the output)."""
    if not isinstance(item, dict) or not isinstance(item.get("meta_info"), dict):
        raise RuntimeError(f"SGLang /generate: a response without meta_info: {str(item)[:200]}")
    meta = item["meta_info"]
    ids = [int(t) for t in item.get("output_ids") or []]
    entries = meta.get("output_token_logprobs") or []
    if len(entries) != len(ids):
        raise RuntimeError(f"SGLang returned {len(ids)} output ids but {len(entries)} log-prob entries")
    lps: list[float] = []
    for tok, entry in zip(ids, entries, strict=True):
        if entry[0] is None or int(entry[1]) != tok:
            raise RuntimeError(f"SGLang log-prob entry {entry!r} does not belong to output token {tok}")
        lps.append(float(entry[0]))
    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else finish
    reason = FINISH_REASONS.get(str(kind))
    if reason is None:
        raise RuntimeError(f"SGLang finished a request with {finish!r}")
    spans = meta.get("weight_versions")
    if spans:
        versions = _versions_from_spans(spans, len(ids))
    elif version is None:
        raise RuntimeError(
            "SGLang returned no meta_info.weight_versions (a server older than per-token version spans): "
            "interrupt_mode=keep needs them; use a newer SGLang or interrupt_mode=abort"
        )
    else:
        versions = [_int_version(meta.get("weight_version", version))] * len(ids)
    return backend_completion(prompt, ids, lps, versions, reason, len(spans or ()))


def _int_version(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise RuntimeError(
            f"SGLang reports weight version {value!r}, not one of this run's (an update from elsewhere?)"
        ) from None


def _versions_from_spans(spans: Sequence[dict[str, Any]], count: int) -> list[int]:
    """Per-token versions from SGLang's ``[{"version", "start", "end"}]`` spans, which must tile ``[0, count)``."""
    versions: list[int] = []
    for span in spans:
        start, end = int(span["start"]), int(span["end"])
        if start != len(versions) or end < start:
            raise RuntimeError(f"SGLang weight_versions spans {list(spans)} do not tile {count} output tokens")
        versions += [_int_version(span["version"])] * (end - start)
    if len(versions) != count:
        raise RuntimeError(f"SGLang weight_versions spans {list(spans)} do not tile {count} output tokens")
    return versions


class SGLangEngine(BackendEngine):
    """``RolloutEngine`` over a running SGLang server (see the module docstring)."""

    BACKEND = "SGLang"

    def __init__(
        self,
        url: str,
        *,
        vocab_size: int,
        max_seq_len: int,
        interrupt_mode: InterruptMode = "abort",
        version: int = 0,
        initial_weights: str | Path | None = None,
        owns_initial_weights: bool = False,
        max_connections: int = 256,
        api_key: str | None = None,
    ) -> None:
        """A client of the SGLang server at ``url`` (``http://host:port``) serving a model of ``vocab_size``
        tokens with a context of at least ``max_seq_len``. ``initial_weights``: a safetensors directory the
        server can read, loaded as version ``version`` before the first request (None: the server's weights are
        taken as version ``version``); ``owns_initial_weights``: that directory is removed by ``close``.
        ``api_key`` (else ``$ASYNCRL_API_KEY``): the server's ``--api-key``."""
        super().__init__(interrupt_mode=interrupt_mode, version=version)
        parsed = urlparse(url if "://" in url else f"http://{url}")
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"SGLangEngine needs an http://host:port URL, got {url!r}")
        if vocab_size < 1 or max_seq_len < 2:
            raise ValueError("vocab_size must be >= 1 and max_seq_len >= 2")
        self.url = f"{parsed.scheme}://{parsed.netloc}"
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self._initial = Path(initial_weights) if initial_weights is not None else None
        self._owns_initial = owns_initial_weights
        self._shapes = checkpoint_shapes(self._initial) if self._initial is not None else None
        self._tied = self._initial is not None and _tied(self._initial)
        self._http = JsonClient(self.url, auth_headers(resolve_api_key(api_key)), max_connections=max_connections)
        self._ready = False

    # ------------------------------------------------------------------------------ backend hooks
    async def _ensure_ready(self) -> None:
        """Before the first request: the server serves a generation model, at this engine's version (its
        starting weights loaded, or its version label set)."""
        if self._ready:
            return
        async with self._control_lock():
            if self._ready:
                return
            info = await self._get("/model_info")
            if not isinstance(info, dict) or info.get("is_generation") is False:
                raise RuntimeError(f"the SGLang server at {self.url} does not serve a generation model: {info}")
            if self._initial is not None:
                await self._load_from_disk(str(self._initial), self._version, flush_cache=True)
            else:
                body = {"new_version": str(self._version), "abort_all_requests": False}
                await self._post("/update_weight_version", body)
            self._ready = True

    async def _prepare_update(self, update: WeightUpdate) -> None:
        """A directory the server reads, names and shapes as the starting checkpoint's, the server ready."""
        if update.path is None:
            raise ValueError(
                "SGLangEngine loads weights from a directory the server reads: export them as safetensors "
                "(trainer.weight_transport=safetensors, trainer.weight_export_dir on a shared filesystem)"
            )
        await self._ensure_ready()
        if self._shapes is not None:
            check_update_shapes(Path(update.path), self._shapes, tied=self._tied, version=update.version)

    def _update_source(self, update: WeightUpdate) -> str | Path:
        assert update.path is not None  # refused by _prepare_update
        return update.path

    async def _pause_backend(self, mode: InterruptMode, *, clear_cache: bool) -> None:
        """``/pause_generation`` (the cache is flushed by the load: ``_load``)."""
        await self._post("/pause_generation", {"mode": _PAUSE_MODE[mode]})

    async def _resume_backend(self) -> None:
        await self._post("/continue_generation", {})

    async def _load(self, path: str | Path, version: int) -> None:
        """In ``abort`` mode with ``flush_cache`` (the server refuses to flush with requests kept in place)."""
        await self._load_from_disk(str(path), version, flush_cache=self.interrupt_mode == "abort")

    async def _abort_backend(self) -> None:
        await self._post("/abort_request", {"abort_all": True})

    def _release(self) -> None:
        """The connections, and the starting weights' directory if this engine owns it."""
        self._http.close()
        if self._owns_initial and self._initial is not None:
            shutil.rmtree(self._initial, ignore_errors=True)

    async def _sample(self, prompt: list[int], sampling: SamplingParams, budget: int, seed: int) -> Completion:
        """One ``/generate`` request, to its end or to an abort."""
        async with self._control_lock():  # not while an update runs: the body names the version's cache namespace
            body = self._request(prompt, sampling, budget, seed if sampling.seed is not None else None)
        with self._in_flight():
            out = await self._post("/generate", body, timeout=None)
        spans_optional = self.interrupt_mode == "abort"
        return completion_from_generate(out, prompt, version=self._version if spans_optional else None)

    # ------------------------------------------------------------------------------ helpers
    async def _load_from_disk(self, path: str, version: int, *, flush_cache: bool) -> None:
        """``/update_weights_from_disk`` of ``path`` labelled ``version``; the client's version follows on success."""
        body = {"model_path": str(path), "weight_version": str(int(version)), "flush_cache": flush_cache}
        out = await self._post("/update_weights_from_disk", body, timeout=None)
        if not isinstance(out, dict) or out.get("success") is not True:
            raise RuntimeError(f"SGLang update_weights_from_disk of {path} failed: {out}")
        self._version = int(version)

    def _request(self, prompt: list[int], sampling: SamplingParams, budget: int, seed: int | None) -> dict[str, Any]:
        """One ``/generate`` body (``GenerateReqInput``; its ``sampling_params``: SGLang's ``SamplingParams``)."""
        params: dict[str, Any] = {
            "max_new_tokens": budget,
            "temperature": 0.0 if sampling.is_greedy else sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "stop_token_ids": list(sampling.stop_token_ids),
            "ignore_eos": True,
        }
        if seed is not None:
            params["sampling_seed"] = seed
        return {
            "rid": f"asyncrl-{uuid.uuid4().hex}",
            "input_ids": prompt,
            "sampling_params": params,
            "return_logprob": True,
            "logprob_start_len": -1,
            "extra_key": f"asyncrl-weights-v{self._version}",
        }

    # ------------------------------------------------------------------------------ transport
    async def _get(self, path: str) -> Any:
        return await self._send("GET", path, None, 60.0)

    async def _post(self, path: str, body: dict[str, Any], *, timeout: float | None = 600.0) -> Any:
        return await self._send("POST", path, body, timeout)

    async def _send(self, method: str, path: str, body: dict[str, Any] | None, timeout: float | None) -> Any:
        """``method path`` with a JSON body; the decoded answer (``{}`` for an empty one). A 4xx raises
        ``ValueError`` (401: ``PermissionError``) with the server's message, anything else ``RuntimeError``."""
        try:
            status, payload = await self._http.call(method, path, body, timeout=timeout)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            raise RuntimeError(f"{method} {path} on the SGLang server at {self.url} failed: {e!r}") from e
        if status >= 400:
            message = error_message(payload)
            if status == 401:
                raise PermissionError(f"{method} {path} on {self.url}: HTTP 401 (the server's --api-key): {message}")
            error = ValueError if status < 500 else RuntimeError
            raise error(f"SGLang {method} {path}: HTTP {status}: {message}")
        return payload


def _tied(model_dir: Path) -> bool:
    """Whether the checkpoint in ``model_dir`` ties its output head to its input embedding (``config.json``)."""
    config = model_dir / "config.json"
    if not config.is_file():
        return False
    return bool(json.loads(config.read_text(encoding="utf-8")).get("tie_word_embeddings", False))
