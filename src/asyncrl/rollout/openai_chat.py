"""OpenAI's chat-completions shapes: request validation into ``ChatRequest``, and the reply.

Owns what the OpenAI-compatible door (``rollout.openai_door``) accepts and answers, and nothing of
sessions or engines:

- ``parse_chat_request(body, ...)``: a ``POST /v1/chat/completions`` body (``messages``, ``tools``,
  ``tool_choice`` auto|none, ``temperature``, ``top_p``, ``max_tokens``/``max_completion_tokens``,
  ``stop`` (strings that are one token each), ``n``, ``seed``, ``logprobs``, ``model``) validated into a
  ``ChatRequest``; anything malformed, unknown or unsupported (``stream``, images, ``top_logprobs``,
  penalties, a lone surrogate in any string, a tool schema whose ``required``/``properties`` are not a
  list/an object) raises ``HTTPError(400)`` with the reason, and so does a request whose messages and
  tools hold more than ``max_chars`` characters (checked before anything is tokenised);
- ``template_messages``: the request's messages as the chat template takes them (an assistant
  message's ``tool_calls`` written back into its text in the call format, ``developer`` as ``system``);
- ``normalized``: a message reduced to what identifies it (role, text, calls), so that a client
  sending back the assistant message it received (an ``openai`` pydantic object, or a dict it built)
  is recognised whatever extra fields it adds;
- ``assistant_reply``: a model turn's text as OpenAI's ``message`` (``content`` and ``tool_calls``
  ``[{id, type: function, function {name, arguments}}]``) and its ``finish_reason``
  (``stop | length | tool_calls``); ``completion_response`` and ``models_response``: the envelopes.

Tool calls are parsed by ``rollout.tools`` (``hermes``, ``tag``: a tool's tag is its function name
and the body fills its first required parameter, ``json``).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from asyncrl.rollout.envs.base import Message
from asyncrl.rollout.tools import HERMES_CLOSE, HERMES_OPEN, ParsedTurn, ToolCall, ToolFormat, format_tool_call
from asyncrl.web import HTTPError, is_int, is_num

__all__ = [
    "ChatRequest",
    "Reply",
    "assistant_reply",
    "completion_response",
    "models_response",
    "normalized",
    "parse_chat_request",
    "request_chars",
    "template_messages",
    "tool_tags",
]

ROLES = ("system", "developer", "user", "assistant", "tool")
_IGNORED = {"user", "metadata", "store", "parallel_tool_calls", "service_tier"}
_NEUTRAL: dict[str, Any] = {"frequency_penalty": 0, "presence_penalty": 0, "top_logprobs": 0}
_SAMPLING = {"temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "n", "seed", "logprobs"}
_SUPPORTED = {"messages", "tools", "tool_choice", "stream", "response_format", "model"}
_SUPPORTED |= _SAMPLING | _IGNORED | set(_NEUTRAL)
MAX_STOP_CHARS = 256
"""The longest ``stop`` string read (a stop string must be one token)."""


def _bad(msg: str) -> HTTPError:
    return HTTPError(400, msg)


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


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, null, or a list of ``{"type": "text", "text": ...}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"{where}: only text content parts ({{'type': 'text', 'text': ...}}) are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"{where}: content must be a string, null or a list of text parts")


def _arguments(raw: Any, where: str) -> str:
    if not isinstance(raw, str):
        raise _bad(f"{where}: function.arguments must be a JSON string")
    return raw


def _calls(raw: Any, where: str) -> tuple[tuple[str, str, str], ...]:
    """An assistant message's ``tool_calls`` as (id, name, arguments)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _bad(f"{where}: tool_calls must be a list")
    calls = []
    for i, call in enumerate(raw):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(f"{where}.tool_calls[{i}]: needs function.name and function.arguments")
        calls.append((str(call.get("id") or ""), fn["name"], _arguments(fn.get("arguments", "{}"), where)))
    return tuple(calls)


def normalized(message: Any, where: str = "message") -> dict[str, Any]:
    """``message`` reduced to role, text, calls (name and parsed arguments) and ``tool_call_id``."""
    if not isinstance(message, dict):
        raise _bad(f"{where} must be an object")
    role = message.get("role")
    if role not in ROLES:
        raise _bad(f"{where}: role must be one of {', '.join(ROLES)}, got {role!r}")
    out: dict[str, Any] = {"role": role, "content": _text(message.get("content"), where)}
    calls = _calls(message.get("tool_calls"), where) if role == "assistant" else ()
    if calls:
        out["tool_calls"] = [{"id": i, "name": n, "arguments": _parsed_or_text(a)} for i, n, a in calls]
    if role == "tool" and message.get("tool_call_id") is not None:
        out["tool_call_id"] = str(message["tool_call_id"])
    return out


def _parsed_or_text(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def same_message(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two normalized messages say the same (calls compared by name and arguments, not by id)."""

    def strip(m: dict[str, Any]) -> dict[str, Any]:
        calls = [(c["name"], c["arguments"]) for c in m.get("tool_calls", [])]
        return {**m, "content": m["content"].strip(), "tool_calls": calls}

    return strip(a) == strip(b)


def tool_tags(tools: tuple[dict[str, Any], ...]) -> dict[str, tuple[str, str]]:
    """The ``tag`` format's tags: tool name -> (tool name, its first required (else first) parameter)."""
    tags: dict[str, tuple[str, str]] = {}
    for tool in tools:
        fn = tool["function"]
        params = fn.get("parameters") or {}
        names = list(params.get("required") or []) + list((params.get("properties") or {}).keys())
        if names:
            tags[fn["name"]] = (fn["name"], str(names[0]))
    return tags


def _call_text(fmt: ToolFormat, name: str, arguments: Any, tags: dict[str, tuple[str, str]]) -> str:
    """One call written back in ``fmt`` (how the model would have written it, ``tools.format_tool_call``);
    in the ``tag`` format the tag is the tool's name and the text its first parameter (``tool_tags``; empty
    when the call lacks it)."""
    args = arguments if isinstance(arguments, dict) else {}
    if fmt == "tag":
        args = {"text": args.get(tags.get(name, (name, ""))[1], "")}
    return format_tool_call(fmt, ToolCall(name, args), tag=name)


def template_messages(
    messages: tuple[dict[str, Any], ...], fmt: ToolFormat, tags: dict[str, tuple[str, str]]
) -> tuple[Message, ...]:
    """Normalized messages as the chat template takes them (see the module docstring)."""
    out = []
    for m in messages:
        role = "system" if m["role"] == "developer" else m["role"]
        text = m["content"] + "".join(_call_text(fmt, c["name"], c["arguments"], tags) for c in m.get("tool_calls", []))
        out.append(Message(role, text))
    return tuple(out)


def _tools(raw: Any) -> tuple[dict[str, Any], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _bad("'tools' must be a list")
    for i, tool in enumerate(raw):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type", "function") != "function"
            or not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
        ):
            raise _bad(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}")
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
    return tuple(raw)


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
            raise _bad(f"a stop string of {len(s)} characters; only single-token stops (at most {MAX_STOP_CHARS} "
                       "characters) are supported")  # fmt: skip
        enc = tokenizer.encode(s, add_special_tokens=False)
        if len(enc) != 1:
            raise _bad(f"stop {s!r} is {len(enc)} tokens in this tokenizer; only single-token stops are supported")
        ids.append(int(enc[0]))
    return tuple(ids)


def _check_options(body: dict[str, Any]) -> None:
    unknown = sorted(set(body) - _SUPPORTED)
    if unknown:
        raise _bad(f"unsupported fields {unknown}; supported: {sorted(_SUPPORTED)}")
    if body.get("stream"):
        raise _bad("stream=true is not supported by this server")
    for key, neutral in _NEUTRAL.items():
        if body.get(key) not in (None, neutral):
            raise _bad(f"{key}={body[key]!r} is not supported (only {neutral!r})")
    fmt = body.get("response_format")
    if fmt not in (None, {"type": "text"}):
        raise _bad("response_format: only {'type': 'text'} is supported")
    if body.get("tool_choice") not in (None, "auto", "none"):
        raise _bad("tool_choice: only 'auto' and 'none' are supported")


def parse_chat_request(body: Any, *, tokenizer: Any, max_slots: int, max_chars: int | None = None) -> ChatRequest:
    """Validate a chat-completions body (see the module docstring). Raises ``HTTPError`` (400).

    ``max_chars``: the most characters of message text and tools (``request_chars``); None: unbounded."""
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object")
    _check_options(body)
    _check_unicode(body)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' must be a non-empty list")
    messages = tuple(normalized(m, f"messages[{i}]") for i, m in enumerate(raw))
    tools = _tools(body.get("tools"))
    if max_chars is not None:
        chars = request_chars(messages, tools)
        if chars > max_chars:
            raise _bad(f"the messages and tools hold {chars} characters; this server reads at most {max_chars} "
                       "per request (max_request_chars)")  # fmt: skip
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not is_int(max_tokens) or max_tokens < 1):
        raise _bad("max_tokens must be an int >= 1")
    temperature = body.get("temperature", 1.0)
    if temperature is None:
        temperature = 1.0
    if not is_num(temperature) or not 0 <= temperature <= 2:
        raise _bad("temperature must be a number in [0, 2]")
    top_p = 1.0 if body.get("top_p") is None else body["top_p"]
    if not is_num(top_p) or not 0 < top_p <= 1:
        raise _bad("top_p must be a number in (0, 1]")
    n = 1 if body.get("n") is None else body["n"]
    if not is_int(n) or not 1 <= n <= max_slots:
        raise _bad(f"n must be an int in [1, {max_slots}]")
    seed = body.get("seed")
    if seed is not None and not is_int(seed):
        raise _bad("seed must be an int")
    logprobs = bool(body.get("logprobs") or False)
    if body.get("tool_choice") == "none":
        tools = ()
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("'model' must be a string")
    return ChatRequest(
        messages=messages, tools=tools, model=model if isinstance(model, str) else "", max_tokens=max_tokens,
        temperature=float(temperature), top_p=float(top_p), stop_ids=_stop_ids(body.get("stop"), tokenizer),
        n=n, seed=None if seed is None else seed % (1 << 31), logprobs=logprobs,
    )  # fmt: skip


# ------------------------------------------------------------------------------------ the reply
@dataclass(frozen=True)
class Reply:
    """One choice's ``message`` and ``finish_reason``."""

    message: dict[str, Any]
    finish_reason: str


def _without_calls(text: str, fmt: ToolFormat, tags: dict[str, tuple[str, str]]) -> str:
    match fmt:
        case "hermes":
            pattern = re.escape(HERMES_OPEN) + ".*?" + re.escape(HERMES_CLOSE)
        case "tag":
            if not tags:
                return text
            pattern = "|".join(f"<{re.escape(t)}>.*?</{re.escape(t)}>" for t in tags)
        case "json":
            return ""
    return re.sub(pattern, "", text, flags=re.DOTALL).strip()


def assistant_reply(
    text: str, parsed: ParsedTurn, truncated: bool, fmt: ToolFormat, tags: dict[str, tuple[str, str]]
) -> Reply:
    """A model turn's text (without its end-of-turn token) as OpenAI's message. Well-formed calls
    become ``tool_calls`` (and leave the content); a turn with malformed calls is all content."""
    if not parsed.calls or parsed.errors:
        return Reply({"role": "assistant", "content": text}, "length" if truncated else "stop")
    calls = [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for c in parsed.calls
    ]
    content = _without_calls(text, fmt, tags) or None
    return Reply(
        {"role": "assistant", "content": content, "tool_calls": calls}, "length" if truncated else "tool_calls"
    )


def token_logprobs(tokenizer: Any, ids: tuple[int, ...], logprobs: tuple[float, ...]) -> dict[str, Any]:
    """OpenAI's ``logprobs`` object of a choice (no alternatives: ``top_logprobs`` is empty)."""
    content = []
    for t, lp in zip(ids, logprobs, strict=True):
        token = tokenizer.decode([t], skip_special_tokens=False)
        content.append({"token": token, "logprob": lp, "bytes": list(token.encode("utf-8")), "top_logprobs": []})
    return {"content": content, "refusal": None}


def completion_response(
    model: str, choices: list[dict[str, Any]], prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """The ``chat.completion`` envelope."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "system_fingerprint": None,
    }


def models_response(model: str) -> dict[str, Any]:
    """``GET /v1/models``: the one model this server serves."""
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "asyncrl"}]}
