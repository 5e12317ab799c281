"""The records every call format shares: a call, a parsed turn, and the JSON reading of a call's body.

``ToolCall`` is one well-formed call; ``ParsedTurn`` is what a model turn holds (its calls in order, one
message per malformed call, its text outside the calls, its reasoning). ``json_call`` reads the
``{"name": ..., "arguments"|"parameters": {...}}`` object that the Hermes, Qwen3, Llama-3 and Mistral
formats write, keeping the arguments' text as the model wrote it (``ToolCall.raw_arguments``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["ParsedTurn", "ToolCall", "Tools", "check_known", "json_call", "strip_one"]

Tools = Mapping[str, Mapping[str, Any]]
"""The tools a turn may call: function name -> its ``parameters`` JSON schema (OpenAI's ``tools`` list as a map)."""


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call: a tool name and its arguments (a JSON object).

    ``id``: the call's id when the format writes one (Mistral's 9 characters), else empty.
    ``raw_arguments``: the arguments' JSON exactly as the model wrote it, where the format writes JSON
    (OpenAI's ``function.arguments`` string; a template given this string renders the model's own text);
    ``None`` where the format writes no JSON object (``tag``, ``qwen3_coder``) or the text could not be
    isolated. Neither takes part in equality: two calls are equal when their name and arguments are."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = field(default="", compare=False)
    raw_arguments: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ParsedTurn:
    """What a model turn asks for: its calls in order and one message per malformed call.

    ``content``: the turn's text for the reader (OpenAI's ``content``): the text outside the calls and the
    reasoning, without the glue the family's template puts around calls; the whole text (less reasoning)
    when a call is malformed; ``None`` when the parser did not compute it (a hand-built turn).
    ``reasoning_content``: the text of the ``<think>`` block for the families that write one (``qwen3``,
    ``deepseek_r1``); ``None`` when the turn has none."""

    calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = ()
    content: str | None = None
    reasoning_content: str | None = None

    @property
    def is_answer(self) -> bool:
        """No call and no attempt at one: the turn is the model's answer."""
        return not self.calls and not self.errors


_NAME_FIRST = re.compile(
    r'\A\{\s*"name"\s*:\s*"(?:[^"\\]|\\.)*"\s*,\s*"(?:arguments|parameters)"\s*:\s*(.*)\}\s*\Z', re.S
)


def json_call(body: str) -> ToolCall | str:
    """A call from a JSON object ``{"name": ..., "arguments": {...}}`` (``parameters`` is read too; the
    arguments may be a JSON string holding an object), or why it is malformed."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return f"the tool call is not valid JSON ({e.msg} at character {e.pos})"
    return call_from_object(obj, _raw_arguments(body))


def call_from_object(obj: Any, raw: str | None = None) -> ToolCall | str:
    """A call from a decoded JSON value, or why it is malformed (``raw``: the arguments' text, if known)."""
    if not isinstance(obj, dict):
        return "the tool call must be a JSON object with `name` and `arguments`"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return "the tool call has no `name`"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        raw = args
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return f"the arguments of {name} are not a JSON object"
    if not isinstance(args, dict):
        return f"the arguments of {name} are not a JSON object"
    call_id = obj.get("id")
    return ToolCall(name, args, id=call_id if isinstance(call_id, str) else "", raw_arguments=raw)


def _raw_arguments(body: str) -> str | None:
    """The arguments' text of a ``{"name": ..., "arguments": ...}`` object written name first, else ``None``."""
    m = _NAME_FIRST.match(body.strip())
    if m is None:
        return None
    raw = m.group(1).rstrip()
    try:
        json.loads(raw)
    except json.JSONDecodeError:
        return None
    return raw


def check_known(turn: ParsedTurn, tools: Tools | None) -> ParsedTurn:
    """``turn`` with each call of a tool not in ``tools`` moved to the errors (``tools=None``: no check)."""
    if tools is None:
        return turn
    known = [c for c in turn.calls if c.name in tools]
    unknown = [c for c in turn.calls if c.name not in tools]
    if not unknown:
        return turn
    names = ", ".join(sorted(tools)) or "none"
    errors = tuple(f"unknown tool {c.name!r} (the tools are: {names})" for c in unknown)
    return replace(turn, calls=tuple(known), errors=turn.errors + errors)


def strip_one(text: str, glue: str = "\n") -> str:
    """``text`` less one trailing ``glue`` (the separator a template writes between content and a call)."""
    return text[: -len(glue)] if glue and text.endswith(glue) else text
