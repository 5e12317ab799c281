"""``asyncrl serve engine``: a ``LocalEngine`` behind the SGLang-native HTTP protocol (subset).

Owns the engine's route table and what each route answers; the HTTP itself (an aiohttp application,
its router and middlewares, keep-alive, the checks every server shares) is ``asyncrl.web``'s
``JsonServer``. Endpoints, request and response shapes follow
SGLang's native API (``sglang/srt/entrypoints/http_server.py``, v0.4.6 - v0.5.x):

- ``POST /generate``: ``input_ids`` (a list of ints, or a batch: list of lists) or ``text``;
  ``sampling_params`` {max_new_tokens, temperature, top_p, top_k (<=0 off), stop_token_ids, n,
  sampling_seed, ignore_eos, ...}; ``return_logprob``; ``rid``. Returns one object (or a list for a
  batch or n > 1): ``text``, ``output_ids``, ``meta_info`` {id, finish_reason {type, matched |
  length | message}, prompt_tokens, completion_tokens, weight_version, output_token_logprobs
  [[logprob, token_id, null], ...] when ``return_logprob``, and our extension
  ``output_token_versions`` (exact per-token versions stamped by the engine)}.
  Like SGLang, generation stops at the tokenizer's EOS unless ``ignore_eos`` is true.
- ``POST /pause_generation`` {mode: "abort" (default, as SGLang) | "in_place"}: stop decoding;
  ``abort`` also ends the running requests with finish_reason "abort" and their partial output.
- ``POST /continue_generation``; ``POST /update_weights_from_disk`` {model_path, weight_version,
  abort_all_requests}; ``GET /health``, ``GET /model_info`` (and ``/get_model_info``),
  ``GET /get_weight_version``, ``GET /stats`` (engine counters; ours).
- The OpenAI-compatible door (``rollout.openai_door``, docs/agent.md): ``POST /v1/chat/completions``,
  ``GET /v1/models``, and the same under ``/sessions/<id>/v1/...`` (recorded token for token),
  ``POST /sessions/<id>/end``, ``GET /sessions/<id>``. Errors are answered as on every other route.
  The model is served as ``served_model_name`` (default: the model directory's name, never its path);
  other names get 404 ``model_not_found``; sessions expire after ``session_ttl_s`` without a call and
  at most ``max_open_sessions`` are open.

Robustness: malformed JSON (invalid UTF-8 included), wrong types, unknown or unsupported sampling
options, non-finite numbers, out-of-vocab ids and over-long inputs get a 4xx with a message (SGLang's
error object); so do a ``/generate`` asking for more than ``max_samples_per_request`` samples (prompts x
``n``) or with more than ``max_request_chars`` characters of ``text``, a weight update whose
``weight_version`` is below the engine's (409: versions only move forward) and one whose files are not
safetensors (400; the engine keeps its weights). Parsing ``/generate`` (tokenising its ``text``) runs
on the door's worker thread (``ChatDoor.off_loop``), never on the event loop; a body
over ``max_body_bytes`` gets 413 (before it is read when its length is declared; chunked bodies are
read up to the limit); a request not complete ``request_timeout_s`` after its first byte (a slow
client, slowloris) gets 408 and its connection is closed; a connection idle for ``idle_timeout_s`` is
closed; an unexpected exception in a handler answers 500 and the server keeps serving.

Security (``asyncrl.auth``, docs/security.md): binds to 127.0.0.1 unless told otherwise, and refuses
to listen beyond loopback without an API key. With a key, every route but ``GET /health`` (which
answers ``{"status": "ok"}`` and nothing else) needs ``Authorization: Bearer <key>``; other requests
get 401 before their body is read, and are logged. ``/update_weights_from_disk`` loads only from
inside ``weights_root`` (symlinks and ``..`` resolved; 403 otherwise), and not at all without one.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from asyncrl.auth import ApiKeyAuth, PathOutsideRoot, check_bind, confine_path
from asyncrl.choices import InterruptMode
from asyncrl.rollout.engine import LocalEngine
from asyncrl.rollout.openai_door import MAX_REQUEST_CHARS, ChatDoor
from asyncrl.rollout.protocol import GenerateRequest, PauseBody, UpdateWeightsBody, parse_generate
from asyncrl.rollout.tools import ToolFormat
from asyncrl.types import WeightUpdate
from asyncrl.web import HTTPError, JsonServer, Request, Route, parse_body
from asyncrl.web.server import serve_forever

__all__ = ["EngineServer", "GenerateRequest", "ServerThread", "serve_engine", "parse_generate"]

log = logging.getLogger(__name__)

MAX_SAMPLES_PER_REQUEST = 1024
"""The default cap on one ``/generate`` request's samples (prompts x ``n``)."""
MAX_OPEN_SESSIONS = 1024
"""The default cap on the door's open sessions."""
SESSION_TTL_S = 3600.0
"""The default time an open session may go without a call before it expires."""


class EngineServer:
    """HTTP front end of one ``LocalEngine`` (see module docstring).

    ``api_key``: the bearer token every request but ``GET /health`` must carry (None: no check,
    loopback only). ``weights_root``: the directory weight updates may be loaded from.
    ``request_timeout_s``/``idle_timeout_s``: slow and idle clients (see the module docstring).
    ``served_model_name``, ``max_samples_per_request``, ``max_request_chars``, ``max_open_sessions``,
    ``session_ttl_s``: the bounds of the module docstring."""

    ROUTES: dict[tuple[str, str], str] = {
        ("GET", "/health"): "_health",
        ("GET", "/health_generate"): "_health",
        ("GET", "/model_info"): "_model_info",
        ("GET", "/get_model_info"): "_model_info",
        ("GET", "/get_weight_version"): "_weight_version",
        ("GET", "/stats"): "_stats",
        ("GET", "/get_server_info"): "_stats",
        ("POST", "/generate"): "_generate",
        ("PUT", "/generate"): "_generate",
        ("POST", "/pause_generation"): "_pause",
        ("POST", "/continue_generation"): "_continue",
        ("POST", "/update_weights_from_disk"): "_update_from_disk",
    }
    """(method, path) -> handler name: every endpoint of the engine's own (the door's are
    ``ChatDoor.routes``); the router gets both, and the tests iterate over this one."""

    def __init__(
        self,
        engine: LocalEngine,
        *,
        model_path: str = "",
        max_body_bytes: int = 8 * 1024 * 1024,
        eos_ids: tuple[int, ...] = (),
        api_key: str | None = None,
        weights_root: str | Path | None = None,
        request_timeout_s: float = 30.0,
        idle_timeout_s: float = 60.0,
        tool_format: ToolFormat = "hermes",
        served_model_name: str | None = None,
        max_samples_per_request: int = MAX_SAMPLES_PER_REQUEST,
        max_request_chars: int = MAX_REQUEST_CHARS,
        max_open_sessions: int = MAX_OPEN_SESSIONS,
        session_ttl_s: float = SESSION_TTL_S,
    ) -> None:
        """``tool_format``: how the door's ``/v1/chat/completions`` reads tool calls in model text."""
        if max_samples_per_request < 1:
            raise ValueError(f"max_samples_per_request must be >= 1, got {max_samples_per_request}")
        self.engine = engine
        self.max_samples_per_request = max_samples_per_request
        self.max_request_chars = max_request_chars
        self._updating = asyncio.Lock()
        self.model_path = model_path
        self.eos_ids = eos_ids
        self.auth = ApiKeyAuth(api_key, "engine server")
        self.weights_root = Path(weights_root) if weights_root is not None else None
        self.door = ChatDoor(
            engine,
            engine.tokenizer,
            model_name=served_model_name or Path(model_path).name or "asyncrl",
            tool_format=tool_format,
            end_of_turn_ids=eos_ids,
            max_slots=engine.max_slots,
            max_seq_len=engine.max_seq_len,
            max_request_chars=max_request_chars,
            max_open_sessions=max_open_sessions,
            session_ttl_s=session_ttl_s,
        )
        routes = [Route(method, path, _with_body(getattr(self, name))) for (method, path), name in self.ROUTES.items()]
        self.http = JsonServer(
            "engine server",
            routes + self.door.routes(),
            _error,
            self.auth,
            max_body_bytes=max_body_bytes,
            request_timeout_s=request_timeout_s,
            idle_timeout_s=idle_timeout_s,
        )

    @property
    def port(self) -> int:
        return self.http.port

    @property
    def requests_served(self) -> int:
        return self.http.served

    @property
    def errors_4xx(self) -> int:
        return self.http.errors_4xx

    @property
    def errors_5xx(self) -> int:
        return self.http.errors_5xx

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen; returns the bound port (``port=0`` picks a free one). Raises
        ``auth.InsecureBindError`` for a non-loopback ``host`` without an API key."""
        check_bind(host, self.auth.enabled, "engine server")
        self.engine.start()
        return await self.http.start(host, port)

    async def stop(self) -> None:
        """Stop listening and close every open connection (a request still running after
        ``web.SHUTDOWN_S`` is cancelled); the door's worker thread goes."""
        await self.http.stop()
        self.door.close()

    # ------------------------------------------------------------------------------ handlers
    async def _health(self, body: Any) -> dict[str, Any]:
        return {"status": "ok"}

    async def _model_info(self, body: Any) -> dict[str, Any]:
        e = self.engine
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "is_generation": True,
            "weight_version": str(e.version),
            "max_slots": e.max_slots,
            "max_seq_len": e.max_seq_len,
            "vocab_size": e.vocab_size,
            "interrupt_mode": e.interrupt_mode,
            "weights_root": str(self.weights_root) if self.weights_root is not None else None,
            "eos_token_ids": list(self.eos_ids),
            "protocol": "sglang-native subset (v0.4.6-v0.5.x) + output_token_versions",
        }

    async def _weight_version(self, body: Any) -> dict[str, Any]:
        return {"weight_version": str(self.engine.version)}

    async def _stats(self, body: Any) -> dict[str, Any]:
        return {
            **self.engine.stats(),
            "http_requests_served": self.requests_served,
            "http_errors_4xx": self.errors_4xx,
            "http_errors_5xx": self.errors_5xx,
            "paused": self.engine.paused,
        }

    async def _generate(self, body: Any) -> Any:
        e = self.engine

        def parse() -> GenerateRequest:
            return parse_generate(
                body,
                max_slots=e.max_slots,
                max_seq_len=e.max_seq_len,
                vocab_size=e.vocab_size,
                eos_ids=self.eos_ids,
                tokenizer=e.tokenizer,
                max_samples=self.max_samples_per_request,
                max_chars=self.max_request_chars,
            )

        g = await self.door.off_loop(parse)
        t0 = time.perf_counter()
        groups = await asyncio.gather(*(e.generate(p, g.sampling, g.n) for p in g.prompts))
        latency = time.perf_counter() - t0
        rid = g.rid or uuid.uuid4().hex
        single = not g.batched and g.n == 1
        out = [
            self._render(c, g.return_logprob, rid if single else f"{rid}-{gi}-{si}", latency)
            for gi, group in enumerate(groups)
            for si, c in enumerate(group)
        ]
        return out[0] if single else out

    def _render(self, c: Any, return_logprob: bool, rid: str, latency: float) -> dict:
        match c.finish_reason:
            case "stop":
                finish = {"type": "stop", "matched": c.output_ids[-1]}
            case "length":
                finish = {"type": "length", "length": len(c.output_ids)}
            case _:
                finish = {
                    "type": "abort",
                    "message": "aborted by a weight update or pause_generation(mode=abort)",
                }
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": len(c.prompt_ids),
            "completion_tokens": len(c.output_ids),
            "cached_tokens": 0,
            "weight_version": str(c.versions[-1] if c.versions else self.engine.version),
            "output_token_versions": list(c.versions),
            "num_interruptions": c.num_interruptions,
            "e2e_latency": latency,
        }
        if return_logprob:
            meta["output_token_logprobs"] = [
                [lp, t, None] for lp, t in zip(c.behav_logprobs, c.output_ids, strict=True)
            ]
        tok = self.engine.tokenizer
        text = tok.decode(list(c.output_ids)) if tok is not None else ""
        return {"text": text, "output_ids": list(c.output_ids), "meta_info": meta}

    async def _pause(self, body: Any) -> dict[str, Any]:
        mode = parse_body(PauseBody, {} if body is None else body).mode
        await self.engine.pause()
        aborted = await self.engine.abort_all() if mode == "abort" else 0
        return {
            "message": "Generation paused successfully.",
            "status": "ok",
            "mode": mode,
            "aborted": aborted,
        }

    async def _continue(self, body: Any) -> dict[str, Any]:
        await self.engine.resume()
        return {"message": "Generation continued successfully.", "status": "ok"}

    async def _update_from_disk(self, body: Any) -> dict[str, Any]:
        update = parse_body(UpdateWeightsBody, body)
        version, abort_all = update.weight_version, update.abort_all_requests
        path = self._confined(update.model_path)
        async with self._updating:  # one update at a time: the check below holds until it is applied
            if version is None:
                version = self.engine.version + 1
            elif version < self.engine.version:
                raise HTTPError(
                    409,
                    f"weight_version {version} is below this engine's version {self.engine.version}: "
                    "weight versions only move forward",
                )
            if abort_all:
                await self.engine.abort_all()
            try:
                await self.engine.update_weights(WeightUpdate(version=version, path=str(path)))
            except (FileNotFoundError, KeyError, ValueError, OSError) as e:
                raise HTTPError(
                    400,
                    f"update_weights_from_disk failed (the engine keeps its weights, version "
                    f"{self.engine.version}): {e}",
                ) from None
        return {
            "success": True,
            "message": f"Succeeded to update model weights. Weight version updated to {version}.",
            "num_paused_requests": 0,
        }

    def _confined(self, model_path: str) -> Path:
        """``model_path`` resolved inside the weights root; 403 outside it or without one."""
        if self.weights_root is None:
            raise HTTPError(
                403,
                "this server loads weights only from its weights root and was started without one "
                "(asyncrl serve engine --weights-root DIR: the trainer's trainer.weight_export_dir)",
            )
        try:
            return confine_path(model_path, self.weights_root)
        except PathOutsideRoot as e:
            log.warning("engine server: refused a weight update from outside the weights root: %s", e)
            raise HTTPError(403, f"update_weights_from_disk refused: {e}") from None


def _with_body(handler: Callable[[Any], Awaitable[Any]]) -> Callable[[Request], Awaitable[Any]]:
    """A handler of the request's JSON body as a route's handler."""

    async def handle(req: Request) -> Any:
        return await handler(req.json())

    return handle


def _error(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """SGLang's error object (``code``: a machine-readable code such as ``model_not_found``; else the status)."""
    return {"object": "error", "message": message, "type": _phrase(status), "param": None, "code": code or status}


def _phrase(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def serve_engine(
    model: str,
    host: str = "127.0.0.1",
    port: int = 30000,
    *,
    max_slots: int,
    max_seq_len: int,
    interrupt_mode: InterruptMode = "abort",
    device: str = "cpu",
    version: int = 0,
    api_key: str | None = None,
    weights_root: str | None = None,
    tool_format: ToolFormat = "hermes",
) -> None:
    """Load ``model`` (a local HF checkpoint dir), start a LocalEngine and serve it until interrupted.

    ``api_key``, ``weights_root`` and ``tool_format``: see :class:`EngineServer` (checked before the model loads)."""
    from asyncrl.models import load_policy, stop_token_ids

    check_bind(host, bool(api_key), "engine server")
    if weights_root is not None and not Path(weights_root).is_dir():
        raise FileNotFoundError(f"--weights-root {weights_root} is not a directory")
    policy, tokenizer = load_policy(model, device=device)
    engine = LocalEngine(
        policy,
        tokenizer,
        max_slots=max_slots,
        max_seq_len=max_seq_len,
        interrupt_mode=interrupt_mode,
        device=device,
        version=version,
    )
    server = EngineServer(
        engine,
        model_path=str(model),
        eos_ids=stop_token_ids(tokenizer, policy),
        api_key=api_key,
        weights_root=weights_root,
        tool_format=tool_format,
    )

    try:
        serve_forever(
            server,
            host,
            port,
            lambda bound: (
                f"asyncrl engine server: http://{host}:{bound} (model {model}, {max_slots} slots; API key "
                f"{'required' if api_key else 'off'}; weight updates from {weights_root or 'nowhere'})"
            ),
        )
    finally:
        engine.close()


class ServerThread:
    """Run an ``EngineServer`` on its own event loop in a daemon thread (tests, benches, notebooks).

    ``with ServerThread(engine) as srv: RemoteEngine(srv.url)``; ``port=0`` picks a free port."""

    def __init__(self, engine: LocalEngine, host: str = "127.0.0.1", port: int = 0, **server_kw: Any) -> None:
        import threading

        self.server = EngineServer(engine, **server_kw)
        self.host = host
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._error: BaseException | None = None

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self.server.start(host, port))
            except BaseException as e:  # surface bind (and insecure bind) errors to the constructor
                self._error = e
                self._loop.close()
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="asyncrl-engine-server", daemon=True)
        self._thread.start()
        ready.wait(30)
        if self._error is not None:
            raise self._error

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.server.port}"

    def stop(self) -> None:
        """Stop the server, end what still runs on its loop (e.g. a refused body being drained), and the thread."""
        if self._loop.is_closed() or not self._loop.is_running():
            return

        async def stop_all() -> None:
            await self.server.stop()
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop_all(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
