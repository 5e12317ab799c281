"""A fake SGLang server for ``tests/rollout/test_sglang_engine.py``: aiohttp handlers that accept and answer exactly
the shapes of SGLang's own source (sglang 0.5.23; each handler's docstring names the file and class), and refuse any
field SGLang does not define, so a client that sends a wrong shape fails the tests.

It decodes with a toy "model" (``toy_logits``: logits from the last token and the weight version) so the tests can
recompute every log-prob under the version a token is stamped with. Like SGLang: requests wait while generation is
paused; pause mode ``abort`` ends running requests with ``finish_reason`` abort and their partial output, ``in_place``
freezes them; a weight update while not paused waits for running requests (SGLang's writer lock); a weight change
records, for each running request with output, where it happened, and a finished request reports
``meta_info.weight_versions`` spans (``utils/weight_versions.py``).
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

# sglang/api/v1/api_types.py, class GenerateRequest (the /generate JSON contract; fields also of GenerateReqInput,
# managers/io_struct.py)
GENERATE_FIELDS = frozenset(
    "rid text input_ids stream sampling_params return_logprob logprob_start_len top_logprobs_num token_ids_logprob "
    "return_hidden_states return_text_in_logprobs bootstrap_host bootstrap_port bootstrap_room bootstrap_pair_key "
    "decode_tp_size routed_dp_rank disagg_prefill_dp_rank image_data mm_hashes video_data audio_data extra_key "
    "priority cache_salt require_reasoning lora_path session_params kv_hints routing_key max_thinking_tokens "
    "session_id custom_logit_processor custom_labels images_config return_prompt_token_ids routed_experts_start_len "
    "return_sampling_mask modalities".split()
)
# sglang/api/v1/api_types.py, class SamplingParams ("unknown keys rejected" by the real server too)
SAMPLING_FIELDS = frozenset(
    "max_new_tokens stop stop_token_ids stop_regex temperature top_p top_k min_p frequency_penalty presence_penalty "
    "repetition_penalty min_new_tokens n json_schema regex ebnf structural_tag ignore_eos skip_special_tokens "
    "spaces_between_special_tokens no_stop_trim stream_interval logit_bias sampling_seed custom_params beam_width "
    "watermark choice".split()
)
# managers/io_struct.py: BaseReq's fields, inherited by every control request below
BASE_REQ = frozenset({"rid", "http_worker_ipc"})
# managers/io_struct.py, class UpdateWeightFromDiskReqInput
UPDATE_FROM_DISK_FIELDS = BASE_REQ | {
    "model_path",
    "load_format",
    "abort_all_requests",
    "weight_version",
    "is_async",
    "torch_empty_cache",
    "keep_pause",
    "recapture_cuda_graph",
    "token_step",
    "flush_cache",
    "manifest",
}
PAUSE_FIELDS = BASE_REQ | {"mode"}  # managers/io_struct.py, class PauseGenerationReqInput
PAUSE_MODES = ("abort", "retract", "in_place")  # PauseGenerationReqInput.mode: Literal[...]
CONTINUE_FIELDS = BASE_REQ | {"torch_empty_cache"}  # managers/io_struct.py, class ContinueGenerationReqInput
# managers/io_struct.py, class AbortReq
ABORT_FIELDS = BASE_REQ | {"abort_all", "finished_reason", "abort_message", "weight_versions"}
# managers/io_struct.py, class UpdateWeightVersionReqInput
WEIGHT_VERSION_FIELDS = BASE_REQ | {"new_version", "abort_all_requests"}

# The types the fake checks, for the fields a client of this project sends.
_INT, _NUM, _BOOL, _STR = (int,), (int, float), (bool,), (str,)
_TYPES: dict[str, tuple[type, ...]] = {
    "rid": _STR,
    "return_logprob": _BOOL,
    "logprob_start_len": _INT,
    "extra_key": _STR,
    "max_new_tokens": _INT,
    "temperature": _NUM,
    "top_p": _NUM,
    "top_k": _INT,
    "ignore_eos": _BOOL,
    "sampling_seed": _INT,
    "model_path": _STR,
    "weight_version": _STR,
    "flush_cache": _BOOL,
    "abort_all_requests": _BOOL,
    "mode": _STR,
    "abort_all": _BOOL,
    "new_version": _STR,
    "torch_empty_cache": _BOOL,
}


class ShapeError(ValueError):
    """A request body SGLang would not take."""


def check_fields(body: Any, allowed: frozenset[str], where: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """``body`` as a dict whose keys are all in ``allowed`` (and ``required`` present), types checked."""
    if not isinstance(body, dict):
        raise ShapeError(f"{where}: a JSON object is required, got {type(body).__name__}")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ShapeError(f"{where}: unknown field(s) {unknown}")
    missing = [k for k in required if k not in body]
    if missing:
        raise ShapeError(f"{where}: missing field(s) {missing}")
    for key, value in body.items():
        want = _TYPES.get(key)
        if (
            want is not None
            and value is not None
            and (not isinstance(value, want) or isinstance(value, bool) != (want == _BOOL))
        ):
            raise ShapeError(f"{where}: {key}={value!r} is not {want}")
    return body


def toy_logits(last: int, version: str, vocab: int) -> list[float]:
    """The fake model's next-token logits after token ``last`` under weights ``version``."""
    v = int(version) if version.isdigit() else 0
    return [((j + 1) * (last + 3) * (v + 2) % 11) / 3.0 for j in range(vocab)]


def toy_logprobs(last: int, version: str, vocab: int, temperature: float) -> list[float]:
    """``log_softmax(toy_logits / T)`` (T <= 0 read as 1, as SGLang reports argmax requests)."""
    t = temperature if temperature > 0 else 1.0
    z = [x / t for x in toy_logits(last, version, vocab)]
    m = max(z)
    lse = m + math.log(sum(math.exp(x - m) for x in z))
    return [x - lse for x in z]


@dataclass
class _Req:
    rid: str
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    events: list[tuple[str, int]] = field(default_factory=list)  # (old version, output tokens at the change)
    aborted: bool = False


class FakeSGLang:
    """The fake server's state and handlers (see the module docstring)."""

    def __init__(self, vocab: int, *, step_s: float = 0.004, spans: bool = True) -> None:
        self.vocab = vocab
        self.step_s = step_s
        self.spans = spans
        self.version = "default"
        self.paused: str | None = None
        self.running: dict[str, _Req] = {}
        self.calls: list[tuple[str, Any]] = []
        self.loaded: list[str] = []
        self.tokens_by_version: dict[str, int] = {}
        self._changed = asyncio.Condition()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/model_info", self.model_info)
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/update_weights_from_disk", self.update_weights_from_disk)
        app.router.add_post("/pause_generation", self.pause_generation)
        app.router.add_post("/continue_generation", self.continue_generation)
        app.router.add_post("/abort_request", self.abort_request)
        app.router.add_post("/update_weight_version", self.update_weight_version)
        return app

    async def _body(self, request: web.Request, allowed: frozenset[str], required: tuple[str, ...] = ()) -> Any:
        body = await request.json()
        self.calls.append((request.path, body))
        return check_fields(body, allowed, request.path, required)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _wait(self, predicate: Any) -> None:
        async with self._changed:
            await self._changed.wait_for(predicate)

    def _set_version(self, new: str) -> None:
        """``Scheduler.record_weight_version_change``: running requests with output record the change."""
        if new == self.version:
            return
        for req in self.running.values():
            if req.output:
                req.events.append((self.version, len(req.output)))
        self.version = new

    # ------------------------------------------------------------------ handlers
    async def model_info(self, request: web.Request) -> web.Response:
        """entrypoints/http_server.py, ``model_info`` (``/get_model_info`` answers the same)."""
        self.calls.append((request.path, None))
        return web.json_response(
            {
                "model_path": "/fake",
                "served_model_name": "/fake",
                "tokenizer_path": "/fake",
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": self.version,
                "load_format": "auto",
                "reasoning_parser": None,
                "tool_call_parser": None,
            }
        )

    async def generate(self, request: web.Request) -> web.Response:
        """entrypoints/http_server.py ``generate_request`` with ``GenerateReqInput`` (managers/io_struct.py) checked
        by ``api_contract.generate_contract_error``; the answer is the tokenizer manager's non-streamed
        ``{"text", "output_ids", "meta_info"}`` (managers/tokenizer_manager.py, ``_handle_batch_output`` and
        ``_handle_abort_req``)."""
        try:
            body = await self._body(request, GENERATE_FIELDS)
            params = check_fields(body.get("sampling_params") or {}, SAMPLING_FIELDS, "sampling_params")
            ids = body.get("input_ids")
            if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
                raise ShapeError("input_ids: a list of ints is required (one prompt)")
        except ShapeError as e:
            return web.json_response({"error": str(e)}, status=400)
        await self._wait(lambda: self.paused is None)
        req = _Req(rid=body.get("rid") or f"r{len(self.calls)}")
        self.running[req.rid] = req
        try:
            finish = await self._decode(req, ids, params)
        finally:
            self.running.pop(req.rid, None)
            await self._notify()
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": finish,
            "prompt_tokens": len(ids),
            "weight_version": self.version,
            "completion_tokens": len(req.output),
            "cached_tokens": 0,
            "reasoning_tokens": 0,
        }
        if body.get("return_logprob"):
            meta["input_token_logprobs"] = []
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(req.logprobs, req.output, strict=True)]
            meta["output_token_logprobs_length"] = len(req.output)
        if self.spans:
            meta["weight_versions"] = _spans(req.events, self.version, len(req.output))
        return web.json_response({"text": "", "output_ids": req.output, "meta_info": meta})

    async def _decode(self, req: _Req, ids: list[int], params: dict[str, Any]) -> dict[str, Any]:
        temperature = float(params.get("temperature", 1.0))
        seed = params.get("sampling_seed")
        stops = set(params.get("stop_token_ids") or [])
        for _ in range(int(params.get("max_new_tokens", 128))):
            await self._wait(lambda: self.paused != "in_place" or req.aborted)
            if req.aborted:
                return {"type": "abort", "message": "Abort in running batch", "status_code": None, "err_type": None}
            pos = len(ids) + len(req.output)
            last = req.output[-1] if req.output else ids[-1]
            lps = toy_logprobs(last, self.version, self.vocab, temperature)
            if temperature <= 0:
                tok = max(range(self.vocab), key=lambda j: lps[j])
            else:
                u, tok = random.Random(f"{seed}-{pos}").random(), self.vocab - 1
                for j, lp in enumerate(lps):
                    u -= math.exp(lp)
                    if u <= 0:
                        tok = j
                        break
            req.output.append(tok)
            self.tokens_by_version[self.version] = self.tokens_by_version.get(self.version, 0) + 1
            req.logprobs.append(lps[tok])
            if tok in stops:
                return {"type": "stop", "matched": tok}
            await asyncio.sleep(self.step_s)
        return {"type": "length", "length": len(req.output)}

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        """entrypoints/http_server.py ``update_weights_from_disk`` with ``UpdateWeightFromDiskReqInput``; answers
        ``{"success", "message", "num_paused_requests"}`` (400 when it fails). Not paused: waits for running
        requests (the tokenizer manager's writer lock). ``flush_cache`` with requests in place fails after the
        weights changed (scheduler_components/weight_updater.py, ``flush_cache_after_weight_update``)."""
        try:
            body = await self._body(request, UPDATE_FROM_DISK_FIELDS, required=("model_path",))
        except ShapeError as e:
            return web.json_response({"error": str(e)}, status=400)
        if not (Path(body["model_path"]) / "model.safetensors").is_file():
            msg = f"Failed to get weights iterator: no safetensors in {body['model_path']}."
            return web.json_response({"success": False, "message": msg, "num_paused_requests": 0}, status=400)
        if self.paused is None:
            await self._wait(lambda: not self.running)
        self.loaded.append(body["model_path"])
        if body.get("weight_version") is not None:
            self._set_version(body["weight_version"])
        if body.get("flush_cache", True) and self.running:
            msg = "Weights were updated, but the cache was not flushed because requests are still running or queued."
            return web.json_response({"success": False, "message": msg, "num_paused_requests": 0}, status=400)
        msg = "Succeeded to update model weights."
        return web.json_response({"success": True, "message": msg, "num_paused_requests": 0})

    async def pause_generation(self, request: web.Request) -> web.Response:
        """entrypoints/http_server.py ``pause_generation`` with ``PauseGenerationReqInput`` (``mode``: abort |
        retract | in_place); ``abort`` aborts every request and returns once none runs (``TokenizerManager.
        pause_generation``)."""
        try:
            body = await self._body(request, PAUSE_FIELDS)
            mode = body.get("mode", "abort")
            if mode not in PAUSE_MODES:
                raise ShapeError(f"Invalid mode: {mode!r}. Expected one of {list(PAUSE_MODES)}.")
        except ShapeError as e:
            return web.json_response({"error": str(e)}, status=400)
        self.paused = mode
        if mode == "abort":
            for req in self.running.values():
                req.aborted = True
            await self._notify()
            await self._wait(lambda: not self.running)
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        """entrypoints/http_server.py ``continue_generation`` with ``ContinueGenerationReqInput``."""
        try:
            await self._body(request, CONTINUE_FIELDS)
        except ShapeError as e:
            return web.json_response({"error": str(e)}, status=400)
        self.paused = None
        await self._notify()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def abort_request(self, request: web.Request) -> web.Response:
        """entrypoints/http_server.py ``abort_request`` with ``AbortReq``: an empty 200."""
        try:
            body = await self._body(request, ABORT_FIELDS)
        except ShapeError as e:
            return web.json_response({"error": str(e)}, status=400)
        for req in self.running.values():
            if body.get("abort_all") or req.rid == body.get("rid"):
                req.aborted = True
        await self._notify()
        return web.Response(status=200)

    async def update_weight_version(self, request: web.Request) -> web.Response:
        """entrypoints/http_server.py ``update_weight_version`` with ``UpdateWeightVersionReqInput``."""
        try:
            body = await self._body(request, WEIGHT_VERSION_FIELDS, required=("new_version",))
        except ShapeError as e:
            return web.json_response({"error": str(e)}, status=400)
        self._set_version(body["new_version"])
        new = body["new_version"]
        return web.json_response({"success": True, "message": f"Weight version updated to {new}", "new_version": new})


def _spans(events: list[tuple[str, int]], current: str, count: int) -> list[dict[str, Any]]:
    """``compute_weight_version_spans`` then ``add_weight_versions_to_meta_info`` (utils/weight_versions.py)."""
    spans: list[dict[str, Any]] = []
    for version, end in [*events, (current, count)]:
        end = min(end, count)
        if spans and end <= spans[-1]["end"]:
            continue
        if spans and version == spans[-1]["version"]:
            spans[-1]["end"] = end
            continue
        spans.append({"version": version, "start": spans[-1]["end"] if spans else 0, "end": end})
    return spans
