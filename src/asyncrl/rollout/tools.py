"""Tool calls in model text: the record of a call and the parsers of the two formats.

Owns how a model turn's decoded text becomes tool calls (or parse errors the model is told about):

- ``hermes``: the Hermes / Qwen convention, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  (any number per turn; ``arguments`` may also be a JSON string holding an object, as some models
  write it);
- ``tag``: a format a tiny model can learn, ``<TAG>text</TAG>``, where ``TAG`` is a tool's short tag
  and ``text`` fills its single argument (``<calc>12345*678</calc>`` calls the calculator);
- ``json``: the Llama-3.1 convention, the whole turn is one JSON object
  ``{"name": ..., "parameters": {...}}`` (a turn that does not start with ``{`` is an answer).

Text outside the calls is ignored. A turn with neither a call nor an opening tag is an answer. An
opening tag without its close, a body that is not a JSON object, a call without a name: each is
one *malformed* call, reported as a message, never dropped silently. Parsing reads text only; the
token ids the model sampled are kept elsewhere and never re-derived from it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from asyncrl.choices import ToolFormat

__all__ = ["ParsedTurn", "ToolCall", "ToolFormat", "close_tags", "format_tool_call", "parse_tool_calls"]

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call: a tool name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ParsedTurn:
    """What a model turn asks for: its calls in order and one message per malformed call."""

    calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = ()

    @property
    def is_answer(self) -> bool:
        """No call and no attempt at one: the turn is the model's answer."""
        return not self.calls and not self.errors


def close_tags(fmt: ToolFormat, tags: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The strings that close a call in ``fmt`` (``tags``: the tools' short tags for ``tag``)."""
    match fmt:
        case "hermes":
            return (HERMES_CLOSE,)
        case "tag":
            return tuple(f"</{t}>" for t in tags)
        case "json":
            return ()


def format_tool_call(fmt: ToolFormat, call: ToolCall, tag: str | None = None) -> str:
    """The text of ``call`` in ``fmt``, as a demonstration writes it (``parse_tool_calls`` reads it
    back as ``call``). ``tag``: the tool's short tag (``tag`` format; its single argument is the text)."""
    match fmt:
        case "hermes":
            body = json.dumps({"name": call.name, "arguments": call.arguments})
            return f"{HERMES_OPEN}{body}{HERMES_CLOSE}"
        case "tag":
            if tag is None or len(call.arguments) != 1:
                raise ValueError(f"the tag format needs a short tag and one argument, got {tag!r}, {call.arguments}")
            (value,) = call.arguments.values()
            return f"<{tag}>{value}</{tag}>"
        case "json":
            return json.dumps({"name": call.name, "parameters": call.arguments})


def parse_tool_calls(fmt: ToolFormat, text: str, tags: dict[str, tuple[str, str]] | None = None) -> ParsedTurn:
    """The calls in ``text``. ``tags`` (``tag`` format): short tag -> (tool name, argument name)."""
    match fmt:
        case "hermes":
            return _parse_hermes(text)
        case "tag":
            return _parse_tags(text, tags or {})
        case "json":
            body = text.strip()
            if not body.startswith("{"):
                return ParsedTurn()
            call = _json_call(body)
            return ParsedTurn(errors=(call,)) if isinstance(call, str) else ParsedTurn(calls=(call,))


def _parse_hermes(text: str) -> ParsedTurn:
    calls: list[ToolCall] = []
    errors: list[str] = []
    pos = 0
    while (start := text.find(HERMES_OPEN, pos)) >= 0:
        body_at = start + len(HERMES_OPEN)
        end = text.find(HERMES_CLOSE, body_at)
        if end < 0:
            errors.append(f"{HERMES_OPEN} is not closed by {HERMES_CLOSE}")
            break
        pos = end + len(HERMES_CLOSE)
        call = _json_call(text[body_at:end].strip())
        if isinstance(call, str):
            errors.append(call)
        else:
            calls.append(call)
    if HERMES_CLOSE in text[pos:]:
        errors.append(f"{HERMES_CLOSE} without {HERMES_OPEN}")
    return ParsedTurn(tuple(calls), tuple(errors))


def _json_call(body: str) -> ToolCall | str:
    """A call from the JSON between the tags, or why it is malformed."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return f"the tool call is not valid JSON ({e.msg} at character {e.pos})"
    if not isinstance(obj, dict):
        return "the tool call must be a JSON object with `name` and `arguments`"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return "the tool call has no `name`"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return f"the arguments of {name} are not a JSON object"
    if not isinstance(args, dict):
        return f"the arguments of {name} are not a JSON object"
    return ToolCall(name, args)


def _parse_tags(text: str, tags: dict[str, tuple[str, str]]) -> ParsedTurn:
    if not tags:
        return ParsedTurn()
    names = "|".join(re.escape(t) for t in sorted(tags, key=len, reverse=True))
    opening = re.compile(rf"<({names})>")
    calls: list[ToolCall] = []
    errors: list[str] = []
    pos = 0
    while (m := opening.search(text, pos)) is not None:
        tag = m.group(1)
        close = f"</{tag}>"
        end = text.find(close, m.end())
        if end < 0:
            errors.append(f"<{tag}> is not closed by {close}")
            break
        tool, arg = tags[tag]
        calls.append(ToolCall(tool, {arg: text[m.end() : end]}))
        pos = end + len(close)
    stray = re.search(rf"</({names})>", text[pos:])
    if stray is not None and not errors:
        errors.append(f"{stray.group(0)} without <{stray.group(1)}>")
    return ParsedTurn(tuple(calls), tuple(errors))
