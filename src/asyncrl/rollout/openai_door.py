"""The OpenAI-compatible door of an engine: ``/v1/chat/completions`` over any ``RolloutEngine``, with sessions.

Owns the routes and what each one does; the shapes are ``rollout.openai_chat``'s, the session record
``rollout.openai_session``'s, the answer's writing (JSON choices, stream events) ``rollout.openai_answer``'s.
``ChatDoor`` serves them for ``asyncrl serve engine`` (a thin route in ``rollout.server``) and for ``DoorServer``,
the loopback server an in-process engine gets (bound to 127.0.0.1 with a generated key; the ``openai_agent``
workflow starts one per group):

=========================================  ==============================================================
``POST /v1/chat/completions``              a completion of the messages (``n`` choices); not recorded
``GET /v1/models``                         the one model served
``POST /sessions/<id>/v1/chat/completions`` the same, recorded in session ``<id>`` (``n`` = 1; a server
                                           opens the session on its first call, a workflow beforehand)
``GET /sessions/<id>/v1/models``           as ``/v1/models`` (an ``openai`` client's ``base_url`` is
                                           ``.../sessions/<id>/v1``)
``POST /sessions/<id>/end``                ends the session; body ``{"reward": float}`` (optional)
``POST /sessions/<id>/completions/<cid>/    a reward of the session's completion ``<cid>`` (the ``id`` of
reward``                                   its answer); body ``{"reward": float}``; branching sessions only
``GET /sessions/<id>``                     the record: ids, loss mask, behaviour log-probs, versions
=========================================  ==============================================================

A turn ends at the chat template's end-of-turn tokens, at a request's single-token ``stop`` strings, or
at its budget: ``max_tokens`` (in a session opened with sampling, never more than that sampling's
``max_new_tokens``: a larger request is lowered to it), the session's tokens left, the engine's context.
In a session opened with sampling (a training workflow's), that sampling governs (temperature, top-p,
top-k, seed) whatever the request says: the behaviour log-probs are then those the trainer expects.
Every request field is read as ``rollout.openai_request.FIELDS`` says. For agent code:

- ``stream``: the answer is server-sent events (``web.Stream``: ``chat.completion.chunk`` deltas token by
  token, calls, the ``finish_reason``, the usage chunk of ``stream_options.include_usage``, ``[DONE]``),
  built from the finished turn (the engine answers whole turns); the record is the same either way;
- ``tool_choice`` ``required`` or a named tool: the door cannot constrain decoding, so it writes the
  call's opening for the model (``_forced``: ``hermes``, ``json``, a named ``tag``; else 400), recorded as
  environment tokens; ``none`` (or a later call of a session without ``tools``): calls are not read, the
  tools stay rendered as the recorded opening holds them;
- ``parallel_tool_calls=false``: a call's close that is one token stops the turn; at most one call is
  returned;
- ``logprobs``: each model token's behaviour log-prob with its raw ``bytes`` (``openai_chat.TokenBytes``).

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
from asyncrl.rollout.openai_answer import Answer, Turn, answer_choice, event_stream, stream_events
from asyncrl.rollout.openai_chat import (
    TokenBytes,
    assistant_reply,
    completion_response,
    models_response,
    template_messages,
    tool_tags,
)
from asyncrl.rollout.openai_request import ChatRequest, parse_chat_request, reward_body
from asyncrl.rollout.openai_session import ChatSession, SessionStore
from asyncrl.rollout.openai_tree import set_reward
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.tools import ParsedTurn, ToolCall, ToolFormat, close_tags, format_tool_call, parse_tool_calls
from asyncrl.rollout.tools import reasons as writes_reasoning
from asyncrl.rollout.tools.reasoning import split_reasoning
from asyncrl.types import Completion, ModelSegment
from asyncrl.web import HTTPError, JsonServer, Request, Route
from asyncrl.web.server import Stream

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


TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A tool name the door may write for the model (OpenAI's rule for tool names)."""
_ARGUMENTS, _NAME = "ASYNCRLARGUMENTS", "ASYNCRLTOOLNAME"


def call_opening(fmt: ToolFormat, name: str | None) -> str:
    """A call in ``fmt`` (``tools.format_tool_call``) up to where its arguments begin, or, without a ``name``, up to
    where the name begins (empty for ``tag``, whose tag is the name): what ``tool_choice`` required or named has
    the door write for the model."""
    if name is None:
        if fmt == "tag":
            return ""
        text = format_tool_call(fmt, ToolCall(_NAME), tag=_NAME)
        return text[: text.index(_NAME)]
    text = format_tool_call(fmt, ToolCall(name, {_ARGUMENTS: _ARGUMENTS}), tag=name)
    marks = ('{"' + _ARGUMENTS, "<parameter=" + _ARGUMENTS, _ARGUMENTS)
    return text[: min(i for i in (text.find(m) for m in marks) if i >= 0)]


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
        self._token_bytes: TokenBytes | None = None

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
            Route(
                "POST",
                "/sessions/{session_id}/v1/chat/completions",
                lambda req: self.chat(req.json(), _session_id(req)),
            ),
            Route("GET", "/sessions/{session_id}/v1/models", lambda req: self.models(_session_id(req))),
            Route("POST", "/sessions/{session_id}/end", lambda req: self.end_session(_session_id(req), req.json())),
            Route(
                "POST",
                "/sessions/{session_id}/completions/{completion_id}/reward",
                lambda req: self.completion_reward(_session_id(req), req.params["completion_id"], req.json()),
            ),
            Route("GET", "/sessions/{session_id}", lambda req: self.session_record(_session_id(req))),
        ]

    async def models(self, session_id: str | None = None) -> dict[str, Any]:
        """``/v1/models`` (the same under a session's ``base_url``, its id checked by the route)."""
        return models_response(self.model_name)

    def check_model(self, name: str) -> None:
        """404 ``model_not_found`` (OpenAI's answer) for a model this door does not serve; no name is this one."""
        if name and name != self.model_name and not self.serves_any_model:
            raise HTTPError(
                404,
                f"The model {name!r} does not exist here: this server serves {self.model_name!r} (GET /v1/models)",
                code="model_not_found",
            )

    def open_session(
        self,
        session_id: str,
        sampling: SamplingParams | None = None,
        max_tokens: int | None = None,
        *,
        branching: bool = False,
    ) -> ChatSession:
        """Open session ``session_id`` (``sampling``: what every call of it samples with; ``branching``: it takes
        any history and concurrent calls, each call one completion, ``rollout.openai_tree``)."""
        if not SESSION_ID.fullmatch(session_id):
            raise ValueError(f"bad session id {session_id!r}")
        session = ChatSession(
            session_id, self.renderer, self.tool_format, sampling=sampling, max_tokens=max_tokens, branching=branching
        )
        return self.store.add(session)

    async def end_session(self, session_id: str, body: Any) -> dict[str, Any]:
        reward = reward_body(body, "/end", optional=True)
        session = self.store.end(session_id, reward)
        return session.summary()

    async def completion_reward(self, session_id: str, completion_id: str, body: Any) -> dict[str, Any]:
        """Give a completion of a branching session its own reward (``openai_tree.set_reward``)."""
        reward = reward_body(body, "/reward", optional=False)
        session = self.store.get(session_id)
        if session is None:
            raise HTTPError(404, f"no session {session_id}")
        if not session.branching:
            raise HTTPError(
                400,
                f"session {session_id} is one linear conversation, one reward (/end); rewards "
                "per completion need agent.episode_mode=tree or individual",
            )
        set_reward(session.completions, completion_id, float(reward or 0.0))
        return {"session_id": session_id, "completion_id": completion_id, "reward": reward}

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

    async def chat(self, body: Any, session_id: str | None) -> dict[str, Any] | Stream:
        """A completion (recorded in ``session_id`` when given): OpenAI's JSON, or its events with ``stream``."""
        req = await self.off_loop(self._parse, body)
        self.check_model(req.model)
        if session_id is None:
            answer = await self._unrecorded(req)
        else:
            answer = await self._recorded(req, session_id)
        if req.stream:
            return Stream(event_stream(await self.off_loop(self._stream_events, req, answer)))
        choices = [answer_choice(self.token_bytes, i, t, req.logprobs) for i, t in enumerate(answer.turns)]
        out = completion_response(req.model or self.model_name, choices, answer.prompt_tokens, answer.produced)
        return out | ({"id": answer.completion_id} if answer.completion_id else {})

    async def _recorded(self, req: ChatRequest, session_id: str) -> Answer:
        session = self.store.find_open(session_id)
        if session is None:
            if not self.open_sessions_on_call:
                raise HTTPError(404, f"no session {session_id} (this door's sessions are opened by its workflow)")
            session = self.open_session(session_id)
        if session.busy and not session.branching:
            raise HTTPError(400, f"session {session_id}: another call of it is running (a session is one conversation)")
        session.running += 1
        self.store.touch(session)
        try:
            tools = session.call_tools(req)  # a comparison of messages with the record: no rendering
            lead, lead_ids = await self.off_loop(self._forced, req, tools)
            plan = await self.off_loop(session.plan, req, lead_ids)
            sampling = self._sampling(req, session.sampling, len(plan.input_ids), plan.budget, tools)
            (c,) = await generate_group(self.engine, plan.input_ids, sampling, 1)
        finally:
            session.running -= 1
            self.store.touch(session)
        seg = ModelSegment(c.output_ids, c.behav_logprobs, c.versions, c.finish_reason, c.num_interruptions)
        turn = self._turn(req, c, sampling, lead, parse=bool(req.tools) and req.tool_choice != "none", tools=tools)
        completion_id = session.record(req, plan, seg, turn.reply, turn.text, turn.parsed, turn.closed_by)
        return Answer([turn], len(plan.input_ids), len(seg.token_ids), completion_id)

    async def _unrecorded(self, req: ChatRequest) -> Answer:
        tags = tool_tags(req.tools)
        messages = template_messages(req.messages, self.tool_format, tags)
        lead, lead_ids = await self.off_loop(self._forced, req, req.tools)
        ids = (*await self.off_loop(self.renderer.opening_ids, messages, req.tools), *lead_ids)
        sampling = self._sampling(req, None, len(ids), 1 << 30, req.tools)
        completions = await generate_group(self.engine, ids, sampling, req.n)
        parse = bool(req.tools) and req.tool_choice != "none"
        turns = [self._turn(req, c, sampling, lead, parse=parse, tools=req.tools) for c in completions]
        return Answer(turns, len(ids), sum(len(c.output_ids) for c in completions))

    def _forced(self, req: ChatRequest, tools: tuple[dict[str, Any], ...]) -> tuple[str, tuple[int, ...]]:
        """The opening of a call written for the model under ``tool_choice`` ``required`` or a named tool (text,
        ids; environment tokens of the record), else nothing; 400 where it cannot be written."""
        if req.tool_choice != "required":
            return "", ()
        names = [t["function"]["name"] for t in tools]
        name = req.forced_tool or (names[0] if len(names) == 1 else None)
        if name is not None and name not in names:
            raise HTTPError(400, f"tool_choice names {name!r}, which is not one of this session's tools {names}")
        if name is not None and not TOOL_NAME.fullmatch(name):
            raise HTTPError(
                400,
                f"tool_choice: the door writes the call of {name[:70]!r} for the model, and a tool "
                "name it writes must be 1-64 characters of [A-Za-z0-9_-] (OpenAI's rule)",
            )
        text = call_opening(self.tool_format, name)
        if not text:
            raise HTTPError(
                400,
                f"tool_choice='required' with several tools: the {self.tool_format!r} format has no "
                "opening common to every call; name the tool",
            )
        return text, tuple(int(t) for t in self.tokenizer.encode(text, add_special_tokens=False))

    def _close_ids(self, tools: tuple[dict[str, Any], ...]) -> tuple[int, ...]:
        """The tokens that close a call, where a close is one token (``parallel_tool_calls=false`` stops there)."""
        closes = close_tags(self.tool_format, tuple(t["function"]["name"] for t in tools))
        ids = [self.tokenizer.encode(c, add_special_tokens=False) for c in closes]
        return tuple(int(i[0]) for i in ids if len(i) == 1)

    def _sampling(
        self,
        req: ChatRequest,
        own: SamplingParams | None,
        prompt_len: int,
        budget: int,
        tools: tuple[dict[str, Any], ...] = (),
    ) -> SamplingParams:
        """The call's sampling: the session's (a workflow's) or the request's, within every budget. A
        session's own ``max_new_tokens`` is a cap: a request's larger ``max_tokens`` is lowered to it;
        ``parallel_tool_calls=false`` adds the one-token closes of a call to the stops."""
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
        closes = () if req.parallel_tool_calls or not req.tools or req.tool_choice == "none" else self._close_ids(tools)
        own_stops = own.stop_token_ids if own else ()
        stops = tuple(dict.fromkeys((*self.renderer.end_of_turn_ids, *req.stop_ids, *own_stops, *closes)))
        if own is not None:
            return replace(own, max_new_tokens=min(cap, budget), stop_token_ids=stops)
        return SamplingParams(
            max_new_tokens=min(cap, budget),
            temperature=req.temperature,
            top_p=req.top_p,
            greedy=req.temperature == 0,
            stop_token_ids=stops,
            seed=req.seed,
        )

    def _turn(
        self,
        req: ChatRequest,
        c: Completion,
        sampling: SamplingParams,
        lead: str,
        *,
        parse: bool,
        tools: tuple[dict[str, Any], ...],
    ) -> Turn:
        """One finished completion as the reply: its text (``lead``, the forced opening, then the model's text
        without the stop token it ended at, unless that token closes a call), calls parsed when ``parse``."""
        ids = c.output_ids
        closes = set(self._close_ids(tools)) if not req.parallel_tool_calls else set()
        stopped = c.finish_reason == "stop" and bool(ids) and ids[-1] in sampling.stop_token_ids
        own = ids[:-1] if stopped and ids[-1] not in closes else ids
        closed_by = ids[-1] if stopped and ids[-1] in self.renderer.end_of_turn_ids else None
        text = lead + self.tokenizer.decode(list(own), skip_special_tokens=False)
        tags = tool_tags(tools)
        if parse:
            schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
            parsed = parse_tool_calls(self.tool_format, text, tags, tools=schemas)
        elif writes_reasoning(self.tool_format):  # calls not read; the reasoning still is
            reasoning, rest = split_reasoning(text, opened_by_prompt=self.tool_format == "deepseek_r1")
            parsed = ParsedTurn(content=rest, reasoning_content=reasoning)
        else:
            parsed = ParsedTurn()
        max_calls = None if req.parallel_tool_calls else 1
        reply = assistant_reply(text, parsed, c.finish_reason == "length", self.tool_format, tags, max_calls)
        return Turn(reply, text, parsed, closed_by, lead, own, c.behav_logprobs[: len(own)])

    @property
    def token_bytes(self) -> TokenBytes:
        if self._token_bytes is None or self._token_bytes.tokenizer is not self.tokenizer:
            self._token_bytes = TokenBytes(self.tokenizer)
        return self._token_bytes

    def _stream_events(self, req: ChatRequest, answer: Answer) -> list[bytes]:
        """``openai_answer.stream_events`` of this door (on its worker, as are the token bytes it builds)."""
        return stream_events(req, answer, self.model_name, self.tokenizer, self.token_bytes)


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
            "openai door",
            door.routes(),
            error_body,
            self.auth,
            max_body_bytes=max_body_bytes,
            request_timeout_s=request_timeout_s,
            idle_timeout_s=idle_timeout_s,
            backlog=128,
        )

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
