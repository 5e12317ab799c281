"""OpenAI's chat-completions shapes on the reply side, and the messages a session compares.

Owns what the OpenAI-compatible door (``rollout.openai_door``) answers, and nothing of sessions, engines or
request fields (``rollout.openai_request``):

- ``normalized``: a message reduced to what identifies it (role, text, calls), so that a client sending back
  the assistant message it received (an ``openai`` pydantic object, or a dict it built) is recognised
  whatever extra fields it adds; ``same_message`` compares two;
- ``template_messages``: messages as the chat template takes them (an assistant message's ``tool_calls``
  written back into its text in the call format, ``developer`` as ``system``);
- ``assistant_reply``: a model turn's text as OpenAI's ``message`` (``content`` and ``tool_calls``
  ``[{id, type: function, function {name, arguments}}]``) and its ``finish_reason``
  (``stop | length | tool_calls``); ``completion_response`` and ``models_response``: the envelopes;
- ``TokenBytes`` and ``token_logprobs``: the ``logprobs`` object, each token with its raw ``bytes`` (a
  token that is part of a UTF-8 character is its own bytes, not U+FFFD's);
- streaming: ``text_pieces`` (the text each token adds), ``choice_deltas`` (a finished reply as the
  ``delta`` objects of the ``chat.completion.chunk`` events), ``chunk_response`` and ``sse`` (one event).

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

from transformers.convert_slow_tokenizer import bytes_to_unicode

from asyncrl.rollout.envs.base import Message
from asyncrl.rollout.tools import HERMES_CLOSE, HERMES_OPEN, ParsedTurn, ToolCall, ToolFormat, format_tool_call
from asyncrl.web import HTTPError

__all__ = [
    "Reply",
    "TokenBytes",
    "assistant_reply",
    "choice_deltas",
    "chunk_response",
    "completion_response",
    "models_response",
    "normalized",
    "same_message",
    "sse",
    "template_messages",
    "text_pieces",
    "token_logprobs",
    "tool_tags",
]

ROLES = ("system", "developer", "user", "assistant", "tool")


def _bad(msg: str) -> HTTPError:
    return HTTPError(400, msg)


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
        case _:  # a family format: the parser's own
            return text
    return re.sub(pattern, "", text, flags=re.DOTALL).strip()


def assistant_reply(
    text: str,
    parsed: ParsedTurn,
    truncated: bool,
    fmt: ToolFormat,
    tags: dict[str, tuple[str, str]],
    max_calls: int | None = None,
) -> Reply:
    """A model turn's text (without its end-of-turn token) as OpenAI's message. Well-formed calls become
    ``tool_calls`` (the first ``max_calls`` of them when it is set: ``parallel_tool_calls=false`` is 1; a call's
    id and arguments as the model wrote them where its format writes them) and leave the content (the parser's
    ``content``: without the calls and the glue around them); a turn with malformed calls is all content; the
    reasoning of the families that write it is ``reasoning_content``."""
    message: dict[str, Any] = {"role": "assistant"}
    if not parsed.calls or parsed.errors:
        message["content"] = text if parsed.content is None else parsed.content
        finish = "length" if truncated else "stop"
    else:
        content = _without_calls(text, fmt, tags) if parsed.content is None else parsed.content.strip()
        message["content"] = content or None
        message["tool_calls"] = [
            {
                "id": c.id or f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.raw_arguments or json.dumps(c.arguments)},
            }
            for c in parsed.calls[:max_calls]
        ]
        finish = "length" if truncated else "tool_calls"
    if parsed.reasoning_content is not None:
        message["reasoning_content"] = parsed.reasoning_content
    return Reply(message, finish)


class TokenBytes:
    """Each token's raw bytes, as OpenAI's ``bytes`` field gives them: a token that holds part of a UTF-8
    character (a byte-level BPE piece, a ``<0xE2>`` byte-fallback token) is its own byte(s), never the
    three bytes of U+FFFD that decoding it alone yields. Read from the tokenizer's decoder: ``ByteLevel``
    (GPT-2's byte-to-character table), ``ByteFallback`` and ``Metaspace``/``Replace`` of ``▁``; an added
    token is its text; any other token its decoded text."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        spec = json.loads(backend.decoder.__getstate__()) if backend is not None and backend.decoder else {}
        kinds = [d.get("type") for d in spec.get("decoders", [spec])]
        self.byte_level = "ByteLevel" in kinds
        self.byte_fallback = "ByteFallback" in kinds
        replaces = [d.get("pattern", {}).get("String") for d in spec.get("decoders", []) if d.get("type") == "Replace"]
        self.metaspace = "Metaspace" in kinds or "\u2581" in replaces
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self.added = {int(i): str(t.content) for i, t in added.items()}
        self._byte_of = {c: b for b, c in bytes_to_unicode().items()} if self.byte_level else {}

    def __call__(self, token_id: int) -> bytes:
        if token_id in self.added:
            return self.added[token_id].encode("utf-8")
        piece = self.tokenizer.convert_ids_to_tokens(int(token_id))
        if isinstance(piece, str):
            if self.byte_level and all(c in self._byte_of for c in piece):
                return bytes(self._byte_of[c] for c in piece)
            if self.byte_fallback and (m := _BYTE_TOKEN.fullmatch(piece)) is not None:
                return bytes([int(m.group(1), 16)])
            if self.metaspace:
                return piece.replace("\u2581", " ").encode("utf-8")
        return self.tokenizer.decode([int(token_id)], skip_special_tokens=False).encode("utf-8")

    def entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        """OpenAI's log-prob entry of one token (no alternatives: ``top_logprobs`` is empty)."""
        token = self.tokenizer.decode([int(token_id)], skip_special_tokens=False)
        return {"token": token, "logprob": logprob, "bytes": list(self(token_id)), "top_logprobs": []}


_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_logprobs(token_bytes: TokenBytes, ids: tuple[int, ...], logprobs: tuple[float, ...]) -> dict[str, Any]:
    """OpenAI's ``logprobs`` object of a choice."""
    content = [token_bytes.entry(t, lp) for t, lp in zip(ids, logprobs, strict=True)]
    return {"content": content, "refusal": None}


def text_pieces(tokenizer: Any, ids: tuple[int, ...]) -> list[str]:
    """The text each token adds to ``decode(ids)``, in order (they join to it): a token that ends inside a
    character adds nothing until the character is complete."""
    full = tokenizer.decode(list(ids), skip_special_tokens=False)
    pieces, shown = [], ""
    for k in range(1, len(ids) + 1):
        text = tokenizer.decode(list(ids[:k]), skip_special_tokens=False) if k < len(ids) else full
        if k < len(ids) and (text.endswith("\ufffd") or not full.startswith(text) or not text.startswith(shown)):
            pieces.append("")
            continue
        pieces.append(text[len(shown) :])
        shown = text
    return pieces


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


# ------------------------------------------------------------------------------------ streaming
def chunk_response(
    chunk_id: str, created: int, model: str, choices: list[dict[str, Any]], usage: dict[str, int] | None = None
) -> dict[str, Any]:
    """One ``chat.completion.chunk``; ``usage``: the last chunk's (``stream_options.include_usage``)."""
    chunk = {
        "id": chunk_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": choices,
    }
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def choice_deltas(
    index: int, reply: Reply, pieces: list[tuple[str, list[dict[str, Any]]]], logprobs: bool
) -> list[dict[str, Any]]:
    """The streamed choices (``delta`` objects) of one finished reply, in order: the role; a plain text reply
    piece by piece (``pieces``: (text, its tokens' log-prob entries), one a token: ``text_pieces``); a reply with
    calls or reasoning, its ``reasoning_content``, its content, then one call per chunk (the turn's log-probs with
    the first of them); the ``finish_reason``. Joined by a client they are ``reply.message``, and their log-probs
    (when ``logprobs``) those of the whole turn."""

    def delta(d: dict[str, Any], lps: list[dict[str, Any]], finish: str | None = None) -> dict[str, Any]:
        logs = {"content": lps, "refusal": None} if logprobs else None
        return {"index": index, "delta": d, "logprobs": logs, "finish_reason": finish}

    out = [delta({"role": "assistant", "content": ""}, [])]
    message, entries = reply.message, [e for _, lps in pieces for e in lps]
    if (
        "tool_calls" not in message
        and "reasoning_content" not in message
        and message["content"] == "".join(text for text, _ in pieces)
    ):
        out += [delta({"content": text}, lps) for text, lps in pieces]
    else:
        if "reasoning_content" in message:
            out.append(delta({"reasoning_content": message["reasoning_content"]}, entries))
            entries = []
        out.append(delta({"content": message["content"] or ""}, entries))
        out += [
            delta({"tool_calls": [{"index": k, **call}]}, []) for k, call in enumerate(message.get("tool_calls", []))
        ]
    out.append(delta({}, [], finish=reply.finish_reason))
    return out


def sse(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event (``data: <json>``, or ``data: [DONE]``)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()
