"""The Llama 3.x JSON convention (``json``): the whole turn is the call, ``{"name": ..., "parameters": {...}}``.

Llama 3.1/3.2's templates write a call as ``{"name": "N", "parameters": ARGS}`` right after the assistant
header and close the turn with ``<|eot_id|>`` (``<|eom_id|>`` when the model waits for a built-in tool);
the model may open it with ``<|python_tag|>``, and may write several calls separated by ``;``. A turn that
does not start with ``{`` (after that tag) is an answer; ``arguments`` is read as well as ``parameters``.
Text after the last call is an error (the call is not the whole turn).
"""

from __future__ import annotations

import json

from asyncrl.rollout.tools.base import ParsedTurn, ToolCall, json_call

__all__ = ["PYTHON_TAG", "format_call", "parse"]

PYTHON_TAG = "<|python_tag|>"


def parse(text: str) -> ParsedTurn:
    """The calls of a turn that is one or more JSON objects (``;``-separated), else an answer."""
    body = text.strip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG) :].lstrip()
    if not body.startswith("{"):
        return ParsedTurn(content=text)
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    errors: list[str] = []
    pos = 0
    while pos < len(body):
        try:
            _, end = decoder.raw_decode(body, pos)
        except json.JSONDecodeError as e:
            errors.append(f"the tool call is not valid JSON ({e.msg} at character {e.pos})")
            break
        call = json_call(body[pos:end])
        if isinstance(call, str):
            errors.append(call)
        else:
            calls.append(call)
        rest = body[end:].lstrip()
        if not rest:
            break
        if not rest.startswith(";"):
            errors.append("text after the JSON tool call (a call must be the whole turn; separate calls with ';')")
            break
        rest = rest[1:].lstrip()
        pos = len(body) - len(rest)
    return ParsedTurn(tuple(calls), tuple(errors), content=text if errors else "")


def format_call(call: ToolCall) -> str:
    """One call as Llama 3.x's templates write it."""
    args = call.raw_arguments if call.raw_arguments is not None else json.dumps(call.arguments)
    return f'{{"name": {json.dumps(call.name)}, "parameters": {args}}}'
