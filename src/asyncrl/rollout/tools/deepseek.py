"""DeepSeek-V3's convention (and DeepSeek-R1's, which reasons first): calls between control tokens.

DeepSeek-V3's template writes the content, then ``<｜tool▁calls▁begin｜>``, each call as
``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```<｜tool▁call▁end｜>`` (calls separated
by ``\\n``), then ``<｜tool▁calls▁end｜><｜end▁of▁sentence｜>``; ARGS is the arguments' JSON text as given
(the OpenAI ``arguments`` string). ``parse`` reads every call block between the begin and end tokens;
anything else between them, a block it cannot read, or a missing end token is an error.
"""

from __future__ import annotations

import json
import re

from asyncrl.rollout.tools.base import ParsedTurn, ToolCall

__all__ = ["CALLS_BEGIN", "CALLS_END", "format_call", "parse"]

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_CALL = re.compile(
    re.escape(CALL_BEGIN)
    + r"(?P<type>[^<\n]*)"
    + re.escape(SEP)
    + r"(?P<name>[^\n]*)\n```(?:json)?\n(?P<args>.*?)\n```"
    + re.escape(CALL_END),
    re.S,
)


def parse(text: str) -> ParsedTurn:
    """The calls between ``<｜tool▁calls▁begin｜>`` and ``<｜tool▁calls▁end｜>``."""
    begin = text.find(CALLS_BEGIN)
    if begin < 0:
        return ParsedTurn(content=text)
    end = text.find(CALLS_END, begin)
    if end < 0:
        return ParsedTurn(errors=(f"{CALLS_BEGIN} is not closed by {CALLS_END}",), content=text)
    inner = text[begin + len(CALLS_BEGIN) : end]
    calls: list[ToolCall] = []
    errors: list[str] = []
    pos = 0
    for m in _CALL.finditer(inner):
        if inner[pos : m.start()].strip():
            errors.append(f"text between the tool calls that is not a call: {inner[pos : m.start()].strip()[:40]!r}")
        pos = m.end()
        call = _call(m.group("name").strip(), m.group("args"))
        if isinstance(call, str):
            errors.append(call)
        else:
            calls.append(call)
    if inner[pos:].strip():
        errors.append(f"a tool call block that is not NAME then a ```json block: {inner[pos:].strip()[:40]!r}")
    if text[end + len(CALLS_END) :].strip():
        errors.append(f"text after {CALLS_END}")
    return ParsedTurn(tuple(calls), tuple(errors), content=text if errors else text[:begin])


def _call(name: str, args: str) -> ToolCall | str:
    if not name:
        return "the tool call has no name"
    try:
        value = json.loads(args)
    except json.JSONDecodeError as e:
        return f"the arguments of {name} are not valid JSON ({e.msg} at character {e.pos})"
    if not isinstance(value, dict):
        return f"the arguments of {name} are not a JSON object"
    return ToolCall(name, value, raw_arguments=args)


def format_call(call: ToolCall) -> str:
    """One call, in its own begin/end pair, as DeepSeek-V3's template writes a turn's single call."""
    args = call.raw_arguments if call.raw_arguments is not None else json.dumps(call.arguments, ensure_ascii=False)
    return f"{CALLS_BEGIN}{CALL_BEGIN}function{SEP}{call.name}\n```json\n{args}\n```{CALL_END}{CALLS_END}"
