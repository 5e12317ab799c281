"""Tool calls and reasoning in model text, by model family: the records, and one parser per call format.

Owns how a model turn's decoded text becomes tool calls (or parse errors the model is told about), its
content and its reasoning. ``agent.tool_format`` (``choices.ToolFormat``) names the format; a module per
family holds its parser and writer:

- ``hermes`` (``hermes.py``): Hermes-2-Pro/3 and Qwen2.5, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  (any number per turn);
- ``qwen3``: the same calls as Qwen3's template writes them, after a ``<think>…</think>`` block
  (``reasoning.py``) that becomes ``reasoning_content``;
- ``qwen3_coder`` (``qwen3_coder.py``): ``<tool_call><function=NAME><parameter=KEY>value</parameter>...``;
- ``json`` (``llama.py``): Llama 3.x, the whole turn is ``{"name": ..., "parameters": {...}}`` (an optional
  ``<|python_tag|>`` first; calls separated by ``;``);
- ``mistral`` (``mistral.py``): ``[TOOL_CALLS] [{"name": ..., "arguments": {...}, "id": ...}]``;
- ``deepseek_v3`` (``deepseek.py``): ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME``
  then the arguments in a ```json block;
  ``deepseek_r1``: the same after a ``<think>`` block (the prompt may open it);
- ``tag`` (``tag.py``): a format a tiny model can learn, ``<calc>12345*678</calc>``.

A turn with neither a call nor an opening tag is an answer. An opening without its close, a body that is
not a call, a call without a name, a call of a tool not in ``tools`` (when given): each is one *malformed*
call, reported as a message, never dropped silently, and the turn's content is then its whole text.
Parsing reads text only; the token ids the model sampled are kept elsewhere and never re-derived from it.
"""

from __future__ import annotations

from dataclasses import replace

from asyncrl.choices import ToolFormat
from asyncrl.rollout.tools import deepseek, hermes, llama, mistral, qwen3_coder
from asyncrl.rollout.tools.base import ParsedTurn, ToolCall, Tools, check_known
from asyncrl.rollout.tools.hermes import HERMES_CLOSE, HERMES_OPEN
from asyncrl.rollout.tools.reasoning import split_reasoning
from asyncrl.rollout.tools.tag import format_call as format_tag_call
from asyncrl.rollout.tools.tag import parse as parse_tags

__all__ = [
    "HERMES_CLOSE",
    "HERMES_OPEN",
    "ParsedTurn",
    "ToolCall",
    "ToolFormat",
    "Tools",
    "close_tags",
    "format_tool_call",
    "parse_tool_calls",
    "reasons",
]


def reasons(fmt: ToolFormat) -> bool:
    """Whether the family writes a ``<think>`` block before its answer or calls."""
    return fmt in ("qwen3", "deepseek_r1")


def parse_tool_calls(
    fmt: ToolFormat, text: str, tags: dict[str, tuple[str, str]] | None = None, *, tools: Tools | None = None
) -> ParsedTurn:
    """The calls, content and reasoning of ``text`` in ``fmt``. ``tags`` (``tag`` format): short tag ->
    (tool name, argument name). ``tools``: name -> parameters schema of the tools the turn may call (a
    call of another is malformed; ``qwen3_coder`` types its values by it); ``None``: no check."""
    # R1's prompt opens <think>: a turn without </think> is reasoning cut short, unless it calls (a turn
    # written without reasoning, as a demonstration writes it)
    opened = fmt == "deepseek_r1" and deepseek.CALLS_BEGIN not in text
    reasoning, rest = split_reasoning(text, opened_by_prompt=opened) if reasons(fmt) else (None, text)
    match fmt:
        case "hermes" | "qwen3":
            turn = hermes.parse(rest)
        case "tag":
            turn = parse_tags(rest, tags or {})
        case "json":
            turn = llama.parse(rest)
        case "qwen3_coder":
            turn = qwen3_coder.parse(rest, tools)
        case "mistral":
            turn = mistral.parse(rest)
        case "deepseek_v3" | "deepseek_r1":
            turn = deepseek.parse(rest)
    turn = check_known(turn, tools)
    return replace(turn, content=rest if turn.errors else turn.content, reasoning_content=reasoning)


def close_tags(fmt: ToolFormat, tags: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The strings that close a call in ``fmt`` (``tags``: the tools' short tags for ``tag``); none where a
    call ends only with the turn (``json``, ``mistral``)."""
    match fmt:
        case "hermes" | "qwen3" | "qwen3_coder":
            return (HERMES_CLOSE,)
        case "tag":
            return tuple(f"</{t}>" for t in tags)
        case "deepseek_v3" | "deepseek_r1":
            return (deepseek.CALLS_END,)
        case "json" | "mistral":
            return ()


def format_tool_call(fmt: ToolFormat, call: ToolCall, tag: str | None = None) -> str:
    """The text of ``call`` in ``fmt``, as a demonstration writes it (``parse_tool_calls`` reads it back as
    ``call``). ``tag``: the tool's short tag (``tag`` format; its single argument is the text). The
    arguments' own text (``call.raw_arguments``) is written where the format writes JSON."""
    match fmt:
        case "hermes":
            return hermes.format_call(call, newlines=False)
        case "qwen3":
            return hermes.format_call(call, newlines=True)
        case "tag":
            return format_tag_call(call, tag)
        case "json":
            return llama.format_call(call)
        case "qwen3_coder":
            return qwen3_coder.format_call(call)
        case "mistral":
            return mistral.format_call(call)
        case "deepseek_v3" | "deepseek_r1":
            return deepseek.format_call(call)
