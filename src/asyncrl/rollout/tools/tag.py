"""The ``tag`` format, one a tiny model can learn: ``<TAG>text</TAG>``, where ``TAG`` is a tool's short tag and
``text`` fills its single argument (``<calc>12345*678</calc>`` calls the calculator).

``parse`` is given the tags (short tag -> (tool name, argument name)); a tag that is no tool's is text.
"""

from __future__ import annotations

import re

from asyncrl.rollout.tools.base import ParsedTurn, ToolCall

__all__ = ["format_call", "parse"]


def parse(text: str, tags: dict[str, tuple[str, str]]) -> ParsedTurn:
    """The calls of ``text``; an opening tag without its close, or a close without its opening, is an error."""
    if not tags:
        return ParsedTurn(content=text)
    names = "|".join(re.escape(t) for t in sorted(tags, key=len, reverse=True))
    opening = re.compile(rf"<({names})>")
    calls: list[ToolCall] = []
    errors: list[str] = []
    outside: list[str] = []
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
        outside.append(text[pos : m.start()])
        pos = end + len(close)
    outside.append(text[pos:])
    stray = re.search(rf"</({names})>", text[pos:])
    if stray is not None and not errors:
        errors.append(f"{stray.group(0)} without <{stray.group(1)}>")
    content = text if errors else "".join(outside).strip()
    return ParsedTurn(tuple(calls), tuple(errors), content=content)


def format_call(call: ToolCall, tag: str | None) -> str:
    """``<tag>value</tag>`` for a call of one argument."""
    if tag is None or len(call.arguments) != 1:
        raise ValueError(f"the tag format needs a short tag and one argument, got {tag!r}, {call.arguments}")
    (value,) = call.arguments.values()
    return f"<{tag}>{value}</{tag}>"
