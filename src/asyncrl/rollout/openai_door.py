"""The OpenAI-compatible door of an engine: ``/v1/chat/completions`` over any ``RolloutEngine``, with sessions.

Owns the routes and what each one does; the shapes are ``rollout.openai_chat``'s, the session record
``rollout.openai_session``'s. ``ChatDoor`` serves them for ``asyncrl serve engine`` (a thin route in
``rollout.server``) and for ``DoorServer``, the loopback server an in-process engine gets (bound to
127.0.0.1 with a generated key; the ``openai_agent`` workflow starts one per group):

=========================================  ==============================================================
``POST /v1/chat/completions``              a completion of the messages (``n`` choices); not recorded
``GET /v1/models``                         the one model served
``POST /sessions/<id>/v1/chat/completions`` the same, recorded in session ``<id>`` (``n`` = 1; a server
                                           opens the session on its first call, a workflow beforehand)
``GET /sessions/<id>/v1/models``           as ``/v1/models`` (an ``openai`` client's ``base_url`` is
                                           ``.../sessions/<id>/v1``)
``POST /sessions/<id>/end``                ends the session; body ``{"reward": float}`` (optional)
``GET /sessions/<id>``                     the record: ids, loss mask, behaviour log-probs, versions
=========================================  ==============================================================

A turn ends at the chat template's end-of-turn tokens, at a request's single-token ``stop`` strings, or
at its budget: ``max_tokens`` (in a session opened with sampling, never more than that sampling's
``max_new_tokens``: a larger request is lowered to it), the session's tokens left, the engine's context.
In a session opened with sampling (a training workflow's), that sampling governs (temperature, top-p,
top-k, seed) whatever the request says: the behaviour log-probs are then those the trainer expects.

What a client cannot do here (docs/security.md):

- forge a turn: message text, tool results and tool schemas are encoded as text, so control tokens
  come only from the chat template (``rollout.chat``);
- stall the server: a request's messages and tools may hold at most ``max_request_chars`` characters
  (400 naming the limit, checked before tokenising), and validation, rendering and tokenising run on
  one worker thread of the door (``off_loop``), never on the event loop;
- keep sessions forever: a server's sessions expire after ``session_ttl_s`` without a call, and past
  ``max_open_sessions`` the least recently used idle one is evicted; their ids then answer 404 saying
  why (``openai_session.SessionStore``);
- name another model: ``model`` must be the served name (``model_name``), else 404 ``model_not_found``
  as OpenAI answers; the workflow's door (``serves_any_model``) lets an agent name any model;
- learn a path: ``/v1/models`` lists ``model_name`` only (a server gives the model directory's name).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

from asyncrl.auth import ApiKeyAuth
from asyncrl.rollout.api import RolloutEngine
from asyncrl.rollout.chat import ChatRenderer
from asyncrl.rollout.interruptible import generate_group
from asyncrl.rollout.openai_chat import (
    ChatRequest,
    assistant_reply,
    completion_response,
    models_response,
    parse_chat_request,
    template_messages,
    token_logprobs,
    tool_tags,
)
from asyncrl.rollout.openai_session import ChatSession, SessionStore
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.tools import ToolFormat, parse_tool_calls
from asyncrl.types import Completion, ModelSegment
from asyncrl.web import HTTPError, JsonServer, Request, Route, is_finite

__all__ = ["ChatDoor", "DoorServer", "MAX_REQUEST_CHARS", "SESSION_ID"]

T = TypeVar("T")
MAX_REQUEST_CHARS = 1_000_000
"""The default cap on a chat request's characters of message text and tools (``openai_chat.request_chars``)."""

SESSION_ID = re.compile(r"[A-Za-z0-9_.@:-]{1,160}")


def _session_id(req: Request) -> str:
    """The route's ``{session_id}``; 400 when it is not one."""
    session_id = req.params["session_id"]
    if not SESSION_ID.fullmatch(session_id):
        raise HTTPError(400, f"a session id is 1-160 characters of [A-Za-z0-9_.@:-], got {session_id[:40]!r}")
    return session_id


class ChatDoor:
    """The door's routes over ``engine`` (see the module docstring)."""

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: Any,
        *,
        model_name: str = "asyncrl",
        tool_format: ToolFormat = "hermes",
        end_of_turn_ids: tuple[int, ...] = (),
        max_slots: int = 64,
        max_seq_len: int | None = None,
        default_max_tokens: int = 512,
        open_sessions_on_call: bool = True,
        serves_any_model: bool = False,
        max_request_chars: int | None = MAX_REQUEST_CHARS,
        max_open_sessions: int | None = None,
        session_ttl_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``end_of_turn_ids``: the tokens that end a model turn (default: the EOS); ``max_seq_len``:
        the engine's context (None: not checked here); ``open_sessions_on_call``: a call to an unknown
        session opens it (a server) or is refused with 404 (a workflow opens its sessions itself);
        ``serves_any_model``: a request may name any ``model`` (else only ``model_name``);
        ``max_request_chars``, ``max_open_sessions``, ``session_ttl_s``: the bounds of the module
        docstring (None: unbounded; a workflow's door, whose sessions the workflow ends itself);
        ``clock``: the sessions' (monotonic seconds)."""
        if max_request_chars is not None and max_request_chars < 1:
            raise ValueError(f"max_request_chars must be >= 1 (or None), got {max_request_chars}")
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.tool_format: ToolFormat = tool_format
        self.max_slots = max_slots
        self.max_seq_len = max_seq_len
        self.default_max_tokens = default_max_tokens
        self.open_sessions_on_call = open_sessions_on_call
        self.serves_any_model = serves_any_model
        self.max_request_chars = max_request_chars
        self.store = SessionStore(max_open=max_open_sessions, ttl_s=session_ttl_s, clock=clock)
        self._renderer: ChatRenderer | None = None
        self._end_of_turn_ids = end_of_turn_ids
        self._worker: ThreadPoolExecutor | None = None

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the door's one worker thread (validation, rendering, tokenising): the event loop
        keeps serving meanwhile, and the tokenizer is used by one thread of the door at a time."""
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="asyncrl-door-tokenize")
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    def close(self) -> None:
        """Let the worker thread go (it finishes what it runs; a later call starts another)."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.shutdown(wait=False, cancel_futures=True)

    @property
    def renderer(self) -> ChatRenderer:
        if self._renderer is None:
            try:
                self._renderer = ChatRenderer(self.tokenizer, self._end_of_turn_ids)
            except ValueError as e:
                raise HTTPError(400, f"this model cannot serve chat completions: {e}") from None
        return self._renderer

    # ------------------------------------------------------------------------------- routing
    def routes(self) -> list[Route]:
        """The door's route table (module docstring), for the router of the server that serves it."""
        return [
            Route("POST", "/v1/chat/completions", lambda req: self.chat(req.json(), None)),
            Route("GET", "/v1/models", lambda req: self.models()),
            Route("POST", "/sessions/{session_id}/v1/chat/completions",
                  lambda req: self.chat(req.json(), _session_id(req))),
            Route("GET", "/sessions/{session_id}/v1/models", lambda req: self.models(_session_id(req))),
            Route("POST", "/sessions/{session_id}/end", lambda req: self.end_session(_session_id(req), req.json())),
            Route("GET", "/sessions/{session_id}", lambda req: self.session_record(_session_id(req))),
        ]  # fmt: skip

    async def models(self, session_id: str | None = None) -> dict[str, Any]:
        """``/v1/models`` (the same under a session's ``base_url``, its id checked by the route)."""
        return models_response(self.model_name)

    def check_model(self, name: str) -> None:
        """404 ``model_not_found`` (OpenAI's answer) for a model this door does not serve; no name is this one."""
        if name and name != self.model_name and not self.serves_any_model:
            raise HTTPError(
                404, f"The model {name!r} does not exist here: this server serves {self.model_name!r} (GET /v1/models)",
                code="model_not_found",
            )  # fmt: skip

    def open_session(
        self, session_id: str, sampling: SamplingParams | None = None, max_tokens: int | None = None
    ) -> ChatSession:
        """Open session ``session_id`` (``sampling``: what every call of it samples with)."""
        if not SESSION_ID.fullmatch(session_id):
            raise ValueError(f"bad session id {session_id!r}")
        session = ChatSession(session_id, self.renderer, self.tool_format, sampling=sampling, max_tokens=max_tokens)
        return self.store.add(session)

    async def end_session(self, session_id: str, body: Any) -> dict[str, Any]:
        reward = None
        if body is not None:
            if not isinstance(body, dict) or set(body) - {"reward"}:
                raise HTTPError(400, "the body of /end is {} or {'reward': number}")
            reward = body.get("reward")
            if reward is not None and not is_finite(reward):
                raise HTTPError(400, f"'reward' must be a finite number, got {reward!r}")
        session = self.store.end(session_id, None if reward is None else float(reward))
        return session.summary()

    async def session_record(self, session_id: str) -> dict[str, Any]:
        session = self.store.get(session_id)
        if session is None:
            raise HTTPError(404, f"no session {session_id}")
        return session.summary()

    # ------------------------------------------------------------------------------- completions
    def _parse(self, body: Any) -> ChatRequest:
        return parse_chat_request(
            body, tokenizer=self.tokenizer, max_slots=self.max_slots, max_chars=self.max_request_chars
        )

    async def chat(self, body: Any, session_id: str | None) -> dict[str, Any]:
        req = await self.off_loop(self._parse, body)
        self.check_model(req.model)
        if session_id is None:
            return await self._unrecorded(req)
        session = self.store.find_open(session_id)
        if session is None:
            if not self.open_sessions_on_call:
                raise HTTPError(404, f"no session {session_id} (this door's sessions are opened by its workflow)")
            session = self.open_session(session_id)
        if session.busy:
            raise HTTPError(400, f"session {session_id}: another call of it is running (a session is one conversation)")
        session.busy = True
        self.store.touch(session)
        try:
            plan = await self.off_loop(session.plan, req)
            sampling = self._sampling(req, session.sampling, len(plan.input_ids), plan.budget)
            (c,) = await generate_group(self.engine, plan.input_ids, sampling, 1)
        finally:
            session.busy = False
            self.store.touch(session)
        seg = ModelSegment(c.output_ids, c.behav_logprobs, c.versions, c.finish_reason, c.num_interruptions)
        tags = tool_tags(req.tools)
        text, closed_by = self._turn_text(c, sampling)
        parsed = parse_tool_calls(self.tool_format, text, tags)
        reply = assistant_reply(text, parsed, c.finish_reason == "length", self.tool_format, tags)
        session.record(req, plan, seg, reply, text, parsed, closed_by)
        return completion_response(
            req.model or self.model_name,
            [self._choice(0, reply, c, req.logprobs)],
            len(plan.input_ids),
            len(seg.token_ids),
        )

    async def _unrecorded(self, req: ChatRequest) -> dict[str, Any]:
        tags = tool_tags(req.tools)
        messages = template_messages(req.messages, self.tool_format, tags)
        ids = await self.off_loop(self.renderer.opening_ids, messages, req.tools)
        sampling = self._sampling(req, None, len(ids), 1 << 30)
        completions = await generate_group(self.engine, ids, sampling, req.n)
        choices = []
        for i, c in enumerate(completions):
            text, _ = self._turn_text(c, sampling)
            parsed = parse_tool_calls(self.tool_format, text, tags)
            reply = assistant_reply(text, parsed, c.finish_reason == "length", self.tool_format, tags)
            choices.append(self._choice(i, reply, c, req.logprobs))
        produced = sum(len(c.output_ids) for c in completions)
        return completion_response(req.model or self.model_name, choices, len(ids), produced)

    def _sampling(self, req: ChatRequest, own: SamplingParams | None, prompt_len: int, budget: int) -> SamplingParams:
        """The call's sampling: the session's (a workflow's) or the request's, within every budget. A
        session's own ``max_new_tokens`` is a cap: a request's larger ``max_tokens`` is lowered to it."""
        cap = req.max_tokens or (own.max_new_tokens if own is not None else self.default_max_tokens)
        if own is not None:
            cap = min(cap, own.max_new_tokens)
        if self.max_seq_len is not None:
            room = self.max_seq_len - prompt_len
            if room < 1:
                raise HTTPError(
                    400, f"the conversation is {prompt_len} tokens; the engine's context is {self.max_seq_len}"
                )
            cap = min(cap, room)
        stops = tuple(
            dict.fromkeys((*self.renderer.end_of_turn_ids, *req.stop_ids, *(own.stop_token_ids if own else ())))
        )
        if own is not None:
            return replace(own, max_new_tokens=min(cap, budget), stop_token_ids=stops)
        return SamplingParams(
            max_new_tokens=min(cap, budget), temperature=req.temperature, top_p=req.top_p,
            greedy=req.temperature == 0, stop_token_ids=stops, seed=req.seed,
        )  # fmt: skip

    def _turn_text(self, c: Completion, sampling: SamplingParams) -> tuple[str, int | None]:
        """(the turn's text without the stop token it ended at, that token when it ends a turn)."""
        ids = c.output_ids
        stopped = c.finish_reason == "stop" and bool(ids) and ids[-1] in sampling.stop_token_ids
        own = ids[:-1] if stopped else ids
        closed_by = ids[-1] if stopped and ids[-1] in self.renderer.end_of_turn_ids else None
        return self.tokenizer.decode(list(own), skip_special_tokens=False), closed_by

    def _choice(self, index: int, reply: Any, c: Completion, logprobs: bool) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index, "message": reply.message, "finish_reason": reply.finish_reason}
        if logprobs:
            n = len(c.output_ids) - int(c.finish_reason == "stop")
            choice["logprobs"] = token_logprobs(self.tokenizer, c.output_ids[:n], c.behav_logprobs[:n])
        else:
            choice["logprobs"] = None
        return choice


def error_body(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object (``code``: OpenAI's code, e.g. ``model_not_found``; else the status)."""
    kind = "authentication_error" if status == 401 else "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": code or status}}


class DoorServer:
    """A loopback HTTP server of one ``ChatDoor`` (an in-process engine's door) on ``asyncrl.web``.

    ``api_key``: the bearer key every request must carry (``GET /health`` aside, which the door does
    not serve: 404); it is handed to ``auth.ApiKeyAuth`` and not kept elsewhere. Slow clients: a
    request not complete ``request_timeout_s`` after its first byte gets 408; a connection idle for
    ``idle_timeout_s`` is closed."""

    def __init__(
        self,
        door: ChatDoor,
        api_key: str,
        *,
        max_body_bytes: int = 8 * 1024 * 1024,
        request_timeout_s: float = 60.0,
        idle_timeout_s: float = 60.0,
    ) -> None:
        self.door = door
        self.auth = ApiKeyAuth(api_key, "openai door")
        self.http = JsonServer(
            "openai door", door.routes(), error_body, self.auth, max_body_bytes=max_body_bytes,
            request_timeout_s=request_timeout_s, idle_timeout_s=idle_timeout_s, backlog=128,
        )  # fmt: skip

    @property
    def port(self) -> int:
        return self.http.port

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        return await self.http.start(host, port)

    def base_url(self, session_id: str | None = None) -> str:
        """What an ``openai`` client takes as ``base_url`` (of a session, or unrecorded)."""
        root = f"http://127.0.0.1:{self.port}"
        return f"{root}/sessions/{session_id}/v1" if session_id else f"{root}/v1"

    async def stop(self) -> None:
        """Stop listening and end every connection, idle keep-alive ones included (a request still in
        progress is cancelled); the door's worker thread goes."""
        await self.http.stop()
        self.door.close()
