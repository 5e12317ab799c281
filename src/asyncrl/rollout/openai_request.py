"""A chat-completions request body, field by field: what the door does with each of OpenAI's fields.

Owns the request side of the OpenAI-compatible door (``rollout.openai_door``): ``ChatBody``, the body as a
declarative schema (``web.parse_body``), one field per request field of OpenAI's chat-completions API, each
annotated with a ``Door`` rule (supported, ignored, or refused with the reason) that is also the manual's
table (``FIELDS``, docs/agent.md); and ``parse_chat_request``, which reads a body into a ``ChatRequest``:

- ``messages`` (text content parts; roles system, developer, user, assistant, tool) and ``tools``
  (function tools; ``strict: true`` refused) checked by ``openai_chat.normalized`` and ``_tools``;
- ``tool_choice`` ``auto | none | required | {"type": "function", "function": {"name": ...}}`` (a named
  tool must be one of ``tools``), ``parallel_tool_calls``, ``stream`` with ``stream_options``
  (``include_usage``), ``logprobs`` with ``top_logprobs`` 0 (the engine gives the sampled token's
  log-prob only), ``stop`` strings of one token each, the sampling fields;
- every refusal a 400 naming the field and why; a lone surrogate in any string is a 400; so is a request
  whose messages and tools hold more than ``max_chars`` characters (checked before anything is tokenised).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Annotated, Any, Literal, get_type_hints

from asyncrl.rollout.openai_chat import normalized
from asyncrl.web import HTTPError, SchemaError, Spec, is_finite, is_num, parse_body

__all__ = [
    "FIELDS",
    "ChatBody",
    "ChatRequest",
    "Door",
    "MAX_STOP_CHARS",
    "parse_chat_request",
    "request_chars",
    "reward_body",
]

MAX_STOP_CHARS = 256
"""The longest ``stop`` string read (a stop string must be one token)."""
MAX_TOP_LOGPROBS = 20

Treatment = Literal["supported", "ignored", "refused"]


@dataclass(frozen=True)
class Door:
    """What the door does with one request field (a ``ChatBody`` annotation; the manual's table)."""

    treatment: Treatment
    """``supported``; ``ignored`` (accepted, no effect); ``refused`` (400 unless absent or neutral)."""
    what: str
    """What it does, or why it is refused."""


def _neutral(*values: Any) -> Spec:
    """A refused field: only absent, null or one of ``values`` (numbers) passes."""
    what = " or ".join(["null", *(json.dumps(v) for v in values)])
    return Spec(what, lambda v: not isinstance(v, bool) and is_num(v) and v in values)


def _range(lo: float, hi: float) -> Spec:
    return Spec(f"a number in [{lo:g}, {hi:g}]", lambda v: is_num(v) and lo <= v <= hi)


_NO_PENALTY = "0 only: the engine samples without penalties, and the behaviour log-probs must be those of the distribution sampled"  # noqa: E501
_SESSION = "; in a session opened by a training workflow, the workflow's sampling governs"


@dataclass(frozen=True)
class ChatBody:
    """A ``POST /v1/chat/completions`` body; a key it does not name is a 400 listing those it does."""

    messages: Annotated[
        list[Any],
        Spec("a non-empty list of messages", bool),
        Door(
            "supported",
            "text content (a string or text parts); roles system, developer (as "
            "system), user, assistant (with its tool_calls), tool",
        ),
    ]
    model: Annotated[
        str | None,
        Door(
            "supported",
            "must be the served model's name (else 404 model_not_found); a "
            "training workflow's door answers to any name",
        ),
    ] = None
    audio: Annotated[Any, _neutral(), Door("refused", "text only: no audio output")] = None
    frequency_penalty: Annotated[Any, _neutral(0), Door("refused", _NO_PENALTY)] = None
    function_call: Annotated[Any, _neutral(), Door("refused", "deprecated by OpenAI: use tool_choice")] = None
    functions: Annotated[Any, _neutral(), Door("refused", "deprecated by OpenAI: use tools")] = None
    logit_bias: Annotated[
        Any,
        Spec("null or {}", lambda v: v == {}),
        Door(
            "refused", "the engine applies no bias (the behaviour log-probs must be those of the distribution sampled)"
        ),
    ] = None
    logprobs: Annotated[
        bool | None,
        Door(
            "supported", "each token's log-prob as sampled (the behaviour log-prob the trainer gets) and its raw bytes"
        ),
    ] = None
    max_completion_tokens: Annotated[
        int | None,
        Spec("an integer >= 1", lambda v: v >= 1),
        Door("supported", "the turn's token cap (the stop token counts), within the session's and the engine's budget"),
    ] = None
    max_tokens: Annotated[
        int | None,
        Spec("an integer >= 1", lambda v: v >= 1),
        Door("supported", "as max_completion_tokens (which wins when both are given)"),
    ] = None
    metadata: Annotated[dict | None, Door("ignored", "nothing is stored")] = None
    modalities: Annotated[
        Any,
        Spec('null or ["text"]', lambda v: v == ["text"]),
        Door("supported", '["text"] only; audio output is a 400'),
    ] = None
    moderation: Annotated[Any, _neutral(), Door("refused", "no moderation is run on input or output")] = None
    n: Annotated[
        int | None,
        Door(
            "supported", "choices of an unrecorded call (at most the engine's slots); 1 in a session (one conversation)"
        ),
    ] = None
    parallel_tool_calls: Annotated[
        bool | None,
        Door(
            "supported",
            "false: at most one call per turn (the turn "
            "stops after the first call's close when that is one token; "
            "further calls are not returned)",
        ),
    ] = None
    prediction: Annotated[Any, _neutral(), Door("refused", "no speculative decoding of a predicted output")] = None
    presence_penalty: Annotated[Any, _neutral(0), Door("refused", _NO_PENALTY)] = None
    prompt_cache_key: Annotated[str | None, Door("ignored", "prefix reuse is the engine's own, by tokens")] = None
    prompt_cache_options: Annotated[Any, Door("ignored", "prefix reuse is the engine's own, by tokens")] = None
    prompt_cache_retention: Annotated[Any, Door("ignored", "prefix reuse is the engine's own, by tokens")] = None
    reasoning_effort: Annotated[
        Any,
        _neutral(),
        Door("refused", "the chat template is rendered as it is; no control of a model's reasoning length"),
    ] = None
    response_format: Annotated[
        Any,
        Spec('null or {"type": "text"}', lambda v: v == {"type": "text"}),
        Door("supported", '{"type": "text"} only; json_object and json_schema are a 400 (no constrained decoding)'),
    ] = None
    safety_identifier: Annotated[str | None, Door("ignored", "nothing is reported")] = None
    seed: Annotated[int | None, Door("supported", "the sampler's seed" + _SESSION)] = None
    service_tier: Annotated[str | None, Door("ignored", "one tier")] = None
    stop: Annotated[
        Any,
        Door(
            "supported",
            f"up to 4 strings of one token each (at most {MAX_STOP_CHARS} "
            "characters); a string of several tokens is a 400",
        ),
    ] = None
    store: Annotated[
        bool | None,
        Door("ignored", "nothing is stored for OpenAI's tools (a session is recorded for training whatever this says)"),
    ] = None
    stream: Annotated[
        bool | None,
        Door(
            "supported",
            "server-sent events: chat.completion.chunk objects with "
            "delta, the last with finish_reason, then data: [DONE]",
        ),
    ] = None
    stream_options: Annotated[
        dict | None,
        Door(
            "supported",
            "include_usage: a last chunk with usage; "
            "include_obfuscation: accepted, no padding is sent; only with "
            "stream",
        ),
    ] = None
    temperature: Annotated[float | None, _range(0, 2), Door("supported", "0 is greedy" + _SESSION)] = None
    tool_choice: Annotated[
        Any,
        Door(
            "supported",
            'auto, none (calls not parsed), required and {"type": '
            '"function", ...} (the call\'s opening is written for the model)',
        ),
    ] = None
    tools: Annotated[
        list[Any] | None,
        Door(
            "supported",
            "function tools, rendered by the chat template; strict: true is a 400 (no constrained decoding)",
        ),
    ] = None
    top_logprobs: Annotated[
        Any,
        _neutral(0),
        Door("refused", "0 only: the engine returns the sampled token's log-prob, not its distribution"),
    ] = None
    top_p: Annotated[
        float | None, Spec("a number in (0, 1]", lambda v: 0 < v <= 1), Door("supported", "nucleus sampling" + _SESSION)
    ] = None
    user: Annotated[str | None, Door("ignored", "nothing is reported")] = None
    verbosity: Annotated[Any, _neutral(), Door("refused", "no control of the reply's length but max_tokens")] = None
    web_search_options: Annotated[Any, _neutral(), Door("refused", "no web search")] = None


FIELDS: dict[str, Door] = {
    f.name: next(e for e in get_type_hints(ChatBody, include_extras=True)[f.name].__metadata__ if isinstance(e, Door))
    for f in fields(ChatBody)
}
"""Every request field -> what the door does with it (the manual's table)."""


@dataclass(frozen=True)
class ChatRequest:
    """A validated chat-completions body."""

    messages: tuple[dict[str, Any], ...]
    """The conversation, each message ``normalized``."""
    tools: tuple[dict[str, Any], ...]
    """The ``tools`` array as given (``{"type": "function", "function": {...}}``), for the template."""
    model: str
    """The ``model`` asked for; empty when the request names none."""
    max_tokens: int | None
    """Tokens of the reply (the stop token counts); None: the server's or the session's cap."""
    temperature: float
    top_p: float
    stop_ids: tuple[int, ...]
    """The ``stop`` strings as token ids (each string one token)."""
    n: int
    seed: int | None
    logprobs: bool
    tool_choice: Literal["auto", "none", "required"] = "auto"
    forced_tool: str | None = None
    """The tool named by ``tool_choice`` ``{"type": "function", ...}`` (then ``tool_choice`` is ``required``)."""
    parallel_tool_calls: bool = True
    stream: bool = False
    include_usage: bool = False


def _bad(msg: str) -> HTTPError:
    return HTTPError(400, msg)


def _tools(raw: list[Any] | None) -> tuple[dict[str, Any], ...]:
    for i, tool in enumerate(raw or ()):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type", "function") != "function"
            or not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
        ):
            raise _bad(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}")
        if fn.get("strict"):
            raise _bad(
                f"tools[{i}].function.strict=true: this server cannot guarantee arguments that follow the "
                "schema (no constrained decoding); send strict false or leave it out"
            )
        params = fn.get("parameters")
        if params is None:
            continue
        if not isinstance(params, dict):
            raise _bad(f"tools[{i}].function.parameters must be a JSON schema object")
        required = params.get("required")
        if required is not None and (not isinstance(required, list) or not all(isinstance(r, str) for r in required)):
            raise _bad(f"tools[{i}].function.parameters.required must be a list of parameter names")
        if params.get("properties") is not None and not isinstance(params["properties"], dict):
            raise _bad(f"tools[{i}].function.parameters.properties must be an object")
    return tuple(raw or ())


def _tool_choice(raw: Any, tools: tuple[dict[str, Any], ...]) -> tuple[Literal["auto", "none", "required"], str | None]:
    """(``auto | none | required``, the named tool or None)."""
    if raw is None:
        return "auto", None
    if raw in ("auto", "none", "required"):
        if raw == "required" and not tools:
            raise _bad("tool_choice='required' needs tools")
        return raw, None
    fn = raw.get("function") if isinstance(raw, dict) and raw.get("type") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise _bad("tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}")
    names = [t["function"]["name"] for t in tools]
    if fn["name"] not in names:
        raise _bad(f"tool_choice names {fn['name']!r}, which is not one of the tools {names}")
    return "required", fn["name"]


def _check_unicode(body: dict[str, Any]) -> None:
    """400 for a lone surrogate (which JSON escapes can carry and no tokenizer encodes) in any string of ``body``."""
    stack: list[tuple[Any, str]] = [(body, "body")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise _bad(f"{where} is not valid Unicode: a lone surrogate at character {e.start}") from None
        elif isinstance(value, dict):
            stack += [(k, f"{where}: a key") for k in value]
            stack += [(v, f"{where}.{k}" if str(k).isidentifier() else where) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(v, f"{where}[{i}]") for i, v in enumerate(value)]


def request_chars(messages: tuple[dict[str, Any], ...], tools: tuple[dict[str, Any], ...]) -> int:
    """The characters a request gives the chat template: message text, tool-call arguments, the tools' JSON."""
    total = len(json.dumps(tools)) if tools else 0
    for m in messages:
        calls = m.get("tool_calls", ())
        total += len(m["content"]) + sum(len(c["name"]) + len(json.dumps(c["arguments"])) for c in calls)
    return total


def _stop_ids(raw: Any, tokenizer: Any) -> tuple[int, ...]:
    stops = [raw] if isinstance(raw, str) else (raw or [])
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise _bad("'stop' must be a non-empty string or a list of at most 4 of them")
    ids = []
    for s in stops:
        if len(s) > MAX_STOP_CHARS:
            raise _bad(
                f"a stop string of {len(s)} characters; only single-token stops (at most {MAX_STOP_CHARS} "
                "characters) are supported"
            )
        enc = tokenizer.encode(s, add_special_tokens=False)
        if len(enc) != 1:
            raise _bad(f"stop {s!r} is {len(enc)} tokens in this tokenizer; only single-token stops are supported")
        ids.append(int(enc[0]))
    return tuple(ids)


def _stream_options(body: ChatBody) -> bool:
    """``include_usage``; 400 for options without ``stream`` or unknown ones."""
    options = body.stream_options
    if options is None:
        return False
    if not body.stream:
        raise _bad("stream_options is only allowed with stream=true")
    unknown = sorted(set(options) - {"include_usage", "include_obfuscation"})
    if unknown:
        raise _bad(f"unsupported stream_options {unknown}; supported: ['include_obfuscation', 'include_usage']")
    usage = options.get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        raise _bad("'stream_options.include_usage' must be a bool")
    return bool(usage)


def _with_reason(problem: str) -> str:
    """A schema problem, with the reason when it names a refused field."""
    name = problem.split("'")[1] if problem.startswith("'") else ""
    rule = FIELDS.get(name)
    return f"{problem}: {rule.what}" if rule is not None and rule.treatment == "refused" else problem


def parse_chat_request(body: Any, *, tokenizer: Any, max_slots: int, max_chars: int | None = None) -> ChatRequest:
    """Validate a chat-completions body (see the module docstring). Raises ``HTTPError`` (400).

    ``max_chars``: the most characters of message text and tools (``request_chars``); None: unbounded."""
    try:
        b = parse_body(ChatBody, body)
    except SchemaError as e:
        raise _bad("; ".join(_with_reason(p) for p in e.problems)) from None
    _check_unicode(body)
    messages = tuple(normalized(m, f"messages[{i}]") for i, m in enumerate(b.messages))
    tools = _tools(b.tools)
    if max_chars is not None:
        chars = request_chars(messages, tools)
        if chars > max_chars:
            raise _bad(
                f"the messages and tools hold {chars} characters; this server reads at most {max_chars} "
                "per request (max_request_chars)"
            )
    n = 1 if b.n is None else b.n
    if not 1 <= n <= max_slots:
        raise _bad(f"n must be an int in [1, {max_slots}]")
    if b.top_logprobs and not b.logprobs:
        raise _bad("top_logprobs needs logprobs=true")
    choice, forced = _tool_choice(b.tool_choice, tools)
    seed = b.seed
    return ChatRequest(
        messages=messages,
        tools=tools,
        model=b.model or "",
        max_tokens=b.max_completion_tokens if b.max_completion_tokens is not None else b.max_tokens,
        temperature=1.0 if b.temperature is None else b.temperature,
        top_p=1.0 if b.top_p is None else b.top_p,
        stop_ids=_stop_ids(b.stop, tokenizer),
        n=n,
        seed=None if seed is None else seed % (1 << 31),
        logprobs=bool(b.logprobs),
        tool_choice=choice,
        forced_tool=forced,
        parallel_tool_calls=b.parallel_tool_calls is not False,
        stream=bool(b.stream),
        include_usage=_stream_options(b),
    )


def reward_body(body: Any, route: str, *, optional: bool) -> float | None:
    """The ``reward`` of a ``{"reward": number}`` body (``route``'s, named in the 400); None when ``optional``
    and the body is empty or its reward null."""
    shape = f"the body of {route} is {{'reward': number}}" + (" or {}" if optional else "")
    if body is None and optional:
        return None
    if not isinstance(body, dict) or set(body) - {"reward"}:
        raise HTTPError(400, shape)
    reward = body.get("reward")
    if reward is None:
        if optional:
            return None
        raise HTTPError(400, shape)
    if not is_finite(reward):
        raise HTTPError(400, f"'reward' must be a finite number, got {reward!r}")
    return float(reward)
