"""Mistral's convention: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}, "id": "..."}, ...]`` then ``</s>``.

Mistral-7B-Instruct-v0.3's template (and vLLM's ``mistral`` parser) write every call of a turn as one JSON
list after the ``[TOOL_CALLS]`` control token, each call with a 9-character alphanumeric ``id`` that the
tool's result names (``[TOOL_RESULTS]``); content is not written beside calls. ``parse`` reads each
``[TOOL_CALLS]`` segment as a list of calls (or one call object), or as the later tokenizers' (v11+)
``NAME[ARGS]{...}`` / ``NAME{...}``; the text before the first is the content (an answer's, stripped:
the template writes ``" " + content``). ``format_call`` writes one call as its own segment, with the
call's id or, when it has none, an id derived from the call (so a demonstration is the same text each
time).
"""

from __future__ import annotations

import hashlib
import json
import re

from asyncrl.rollout.tools.base import ParsedTurn, ToolCall, call_from_object

__all__ = ["TOOL_CALLS", "format_call", "parse"]

TOOL_CALLS = "[TOOL_CALLS]"
_NAMED = re.compile(r"([A-Za-z0-9_.-]+)\s*(?:\[ARGS\])?\s*(?=\{)")


def parse(text: str) -> ParsedTurn:
    """The calls of every ``[TOOL_CALLS]`` segment of ``text``."""
    head, *segments = text.split(TOOL_CALLS)
    if not segments:
        return ParsedTurn(content=text.strip())  # the template writes an answer as " " + content
    calls: list[ToolCall] = []
    errors: list[str] = []
    for segment in segments:
        for call in _segment(segment.strip()):
            if isinstance(call, str):
                errors.append(call)
            else:
                calls.append(call)
    return ParsedTurn(tuple(calls), tuple(errors), content=text if errors else head.strip())


def _segment(body: str) -> list[ToolCall | str]:
    """The calls of one segment: a JSON list (or object) of calls, or the later tokenizers' ``NAME[ARGS]{...}``."""
    named = _NAMED.match(body)
    if named is not None:
        body = f'{{"name": {json.dumps(named.group(1))}, "arguments": {body[named.end() :]}}}'
    try:
        value, end = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError as e:
        return [f"the tool calls after {TOOL_CALLS} are not valid JSON ({e.msg} at character {e.pos})"]
    found: list[ToolCall | str] = [call_from_object(obj) for obj in (value if isinstance(value, list) else [value])]
    if body[end:].strip():
        found.append(f"text after the JSON of the tool calls: {body[end:].strip()[:40]!r}")
    return found


def format_call(call: ToolCall) -> str:
    """One call as a ``[TOOL_CALLS]`` segment, as Mistral's template writes it."""
    call_id = call.id or call_id_for(call)
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)[:-1]
    return f'{TOOL_CALLS} [{body}, "id": {json.dumps(call_id)}}}]'


def call_id_for(call: ToolCall) -> str:
    """A 9-character alphanumeric id derived from the call (Mistral's ids are 9 alphanumerics)."""
    return hashlib.sha256(json.dumps([call.name, call.arguments], sort_keys=True).encode()).hexdigest()[:9]
