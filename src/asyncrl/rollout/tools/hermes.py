"""The Hermes / Qwen convention: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number per turn.

Hermes-2-Pro/3 and Qwen2.5/Qwen3 write the same call; they differ in the glue around it. Qwen3's template
writes the content, then each call as ``\\n<tool_call>\\n{"name": "N", "arguments": ARGS}\\n</tool_call>``
(the first ``\\n`` only after non-empty content); Hermes' writes no content beside calls. ``parse`` reads
either: the content is the text before the first call less that one ``\\n`` (text after the calls, if
any, follows it on a new line). ``format_call`` writes one call as a Qwen3 template does (``qwen3``) or as
the project's demonstrations always have (``hermes``: no newlines inside the tags).
"""

from __future__ import annotations

import json

from asyncrl.rollout.tools.base import ParsedTurn, ToolCall, json_call, strip_one

__all__ = ["HERMES_CLOSE", "HERMES_OPEN", "format_call", "parse"]

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"


def parse(text: str) -> ParsedTurn:
    """The calls of ``text``; a block that is not a JSON call, or an unclosed/unopened tag, is an error."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    pos = 0
    outside: list[str] = []
    while (start := text.find(HERMES_OPEN, pos)) >= 0:
        outside.append(text[pos:start])
        body_at = start + len(HERMES_OPEN)
        end = text.find(HERMES_CLOSE, body_at)
        if end < 0:
            errors.append(f"{HERMES_OPEN} is not closed by {HERMES_CLOSE}")
            break
        pos = end + len(HERMES_CLOSE)
        call = json_call(text[body_at:end].strip())
        if isinstance(call, str):
            errors.append(call)
        else:
            calls.append(call)
    else:
        outside.append(text[pos:])
    if HERMES_CLOSE in text[pos:]:
        errors.append(f"{HERMES_CLOSE} without {HERMES_OPEN}")
    return ParsedTurn(tuple(calls), tuple(errors), content=text if errors or not calls else _content(outside))


def _content(outside: list[str]) -> str:
    head = strip_one(outside[0])
    rest = "\n".join(part.strip() for part in outside[1:] if part.strip())
    return f"{head}\n{rest}" if head and rest else head or rest


def format_call(call: ToolCall, newlines: bool) -> str:
    """One call's text (``newlines``: the Qwen3 template's ``<tool_call>\\n...\\n</tool_call>``)."""
    ascii_only = not newlines  # Qwen3's template writes JSON as ``tojson`` does: non-ASCII as is
    args = call.raw_arguments
    if args is None:
        args = json.dumps(call.arguments, ensure_ascii=ascii_only)
    body = f'{{"name": {json.dumps(call.name, ensure_ascii=ascii_only)}, "arguments": {args}}}'
    return f"{HERMES_OPEN}\n{body}\n{HERMES_CLOSE}" if newlines else f"{HERMES_OPEN}{body}{HERMES_CLOSE}"
