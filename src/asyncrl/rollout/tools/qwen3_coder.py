"""Qwen3-Coder's XML convention: ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...
</function>\\n</tool_call>``.

Qwen3-Coder's template writes the content (trimmed) then, for each call, ``\\n<tool_call>\\n<function=NAME>\\n``,
each argument as ``<parameter=KEY>\\nVALUE\\n</parameter>\\n`` (VALUE: a string as is, an object or list as
JSON, any other value as text), then ``</function>\\n</tool_call>``. A value is text, so its type comes
from the tool's schema (``tools``), as vLLM's ``qwen3_coder`` parser reads it: ``integer``/``number``
parsed as numbers, ``boolean`` as ``true``/``false``, ``object``/``array`` as JSON, ``null`` as None;
without a schema, or where the text does not parse as the type, the value stays a string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from asyncrl.rollout.tools.base import ParsedTurn, ToolCall, Tools

__all__ = ["format_call", "parse"]

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FUNCTION = re.compile(r"\A\s*<function=([^>\n]+)>(.*)</function>\s*\Z", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


def parse(text: str, tools: Tools | None) -> ParsedTurn:
    """The calls of ``text`` (``tools``: the schemas that type the values; ``None``: every value a string)."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    pos = 0
    while (start := text.find(OPEN, pos)) >= 0:
        end = text.find(CLOSE, start)
        if end < 0:
            errors.append(f"{OPEN} is not closed by {CLOSE}")
            break
        pos = end + len(CLOSE)
        call = _call(text[start + len(OPEN) : end], tools)
        if isinstance(call, str):
            errors.append(call)
        else:
            calls.append(call)
    first = text.find(OPEN)
    if not calls and not errors:
        return ParsedTurn(content=text)
    return ParsedTurn(tuple(calls), tuple(errors), content=text if errors else text[:first].strip())


def _call(body: str, tools: Tools | None) -> ToolCall | str:
    m = _FUNCTION.match(body)
    if m is None:
        return "the tool call is not one <function=NAME>...</function> block"
    name, inner = m.group(1).strip(), m.group(2)
    schema = (tools or {}).get(name) or {}
    properties = schema.get("properties") or {}
    args: dict[str, Any] = {}
    pos = 0
    for p in _PARAMETER.finditer(inner):
        if inner[pos : p.start()].strip():
            return f"text in the call of {name} outside its <parameter=...> blocks"
        pos = p.end()
        value = p.group(2).removeprefix("\n").removesuffix("\n")
        args[p.group(1).strip()] = _typed(value, properties.get(p.group(1).strip()))
    if inner[pos:].strip():
        return f"a <parameter=...> of {name} is not closed by </parameter>"
    return ToolCall(name, args)


def _typed(value: str, prop: Mapping[str, Any] | None) -> Any:
    kind = str((prop or {}).get("type", "string")).lower()
    if kind == "string" or prop is None:
        return value
    if value.strip() == "null":
        return None
    try:
        match kind:
            case "integer":
                return int(value)
            case "number":
                number = float(value)
                return int(number) if number.is_integer() and "." not in value and "e" not in value.lower() else number
            case "boolean":
                return {"true": True, "false": False}[value.strip().lower()]
            case "object" | "array":
                return json.loads(value)
    except (ValueError, KeyError):
        return value
    return value


def format_call(call: ToolCall) -> str:
    """One call as Qwen3-Coder's template writes it (the ``\\n`` before ``<tool_call>`` is the template's glue)."""
    params = "".join(f"<parameter={k}>\n{_text(v)}\n</parameter>\n" for k, v in call.arguments.items())
    return f"{OPEN}\n<function={call.name}>\n{params}</function>\n{CLOSE}"


def _text(value: Any) -> str:
    """A value as the template writes it: a string as is, an object or list as JSON, else Python's ``str``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)
