"""Tool calls and reasoning of each model family, read from that family's own chat template, token-exact.

For each family (``tests/rollout/templates/``, over a small BPE with the family's control tokens): an
assistant turn with tool calls (and reasoning, where the family writes it) is rendered after a prompt;
the ids after the generation prompt up to the end-of-turn token are what the model sampled; they are
decoded, parsed (``rollout.tools.parse_tool_calls``), and the parsed turn rendered again through the
template must give the same ids. Malformed calls come back as text with a reason, and no prefix of a
turn makes a parser raise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest

from asyncrl.choices import ToolFormat
from asyncrl.rollout.tools import ParsedTurn, ToolCall, format_tool_call, parse_tool_calls
from tests.rollout.chat_templates import family_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The forecast of a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "options": {"type": "object"}},
                "required": ["city"],
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
CALC = ToolCall("calculator", {"expression": "48213*379"}, id="a1B2c3D4e")
WEATHER = ToolCall("weather", {"city": "Zürich", "days": 3, "options": {"unit": "C"}}, id="Zz9Yy8Xx7")
HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 48213*379, and the weather in Zürich?"},
]


@dataclass(frozen=True)
class Family:
    """How a family's template takes an assistant message."""

    fmt: ToolFormat
    template: str
    args_as_text: bool = False  # the template writes ``arguments`` as given: the JSON text (DeepSeek)
    no_content: str | None = ""  # what the template takes as "no content beside the calls"
    parallel: bool = True  # several calls in one turn
    content_with_calls: bool = True  # the template writes content beside calls


FAMILIES = {
    "qwen3": Family("qwen3", "qwen3"),
    "qwen3_coder": Family("qwen3_coder", "qwen3_coder"),
    "hermes": Family("hermes", "hermes", content_with_calls=False),
    "llama3": Family("json", "llama3", parallel=False, content_with_calls=False),
    "mistral": Family("mistral", "mistral", content_with_calls=False),
    "deepseek_v3": Family("deepseek_v3", "deepseek_v3", args_as_text=True, no_content=None),
}


@cache
def tokenizer(template: str) -> Any:
    return family_tokenizer(template)


def _call_json(fam: Family, call: ToolCall) -> dict[str, Any]:
    text = call.raw_arguments if call.raw_arguments is not None else json.dumps(call.arguments, ensure_ascii=False)
    args = text if fam.args_as_text else call.arguments
    return {"id": call.id or "call00001", "type": "function", "function": {"name": call.name, "arguments": args}}


def assistant(fam: Family, calls: tuple[ToolCall, ...], content: str = "", reasoning: str | None = None) -> dict:
    """An OpenAI-style assistant message (``reasoning_content`` where the family reasons)."""
    msg: dict[str, Any] = {"role": "assistant", "content": content or (fam.no_content if calls else "")}
    if calls:
        msg["tool_calls"] = [_call_json(fam, c) for c in calls]
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
    return msg


def from_parsed(fam: Family, parsed: ParsedTurn) -> dict[str, Any]:
    """The message a client sends back: the parsed content, reasoning and calls (arguments as parsed)."""
    return assistant(fam, parsed.calls, parsed.content or "", parsed.reasoning_content)


def _ids(tok: Any, messages: list[dict], generation_prompt: bool = False) -> list[int]:
    text = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=generation_prompt)
    return tok.encode(text, add_special_tokens=False)


def round_trip(fam: Family, history: list[dict], msg: dict) -> ParsedTurn:
    """Render ``msg`` after ``history``, parse what the model sampled, render the parse again: same ids."""
    tok = tokenizer(fam.template)
    prompt, full = _ids(tok, history, generation_prompt=True), _ids(tok, [*history, msg])
    assert full[: len(prompt)] == prompt, "the generation prompt is not a token prefix of the rendered turn"
    sampled = full[len(prompt) :]
    sampled = sampled[: sampled.index(tok.eos_token_id) + 1]
    text = tok.decode(sampled[:-1], skip_special_tokens=False)
    parsed = parse_tool_calls(fam.fmt, text, tools=SCHEMAS)
    assert parsed.errors == (), (text, parsed.errors)
    assert _ids(tok, [*history, from_parsed(fam, parsed)]) == full, (text, parsed)
    return parsed


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_one_call_round_trips_token_exact(name: str) -> None:
    fam = FAMILIES[name]
    parsed = round_trip(fam, HISTORY, assistant(fam, (CALC,)))
    assert parsed.calls == (CALC,) and parsed.content == ""
    assert parsed.reasoning_content == ("" if fam.fmt == "qwen3" else None)  # Qwen3 writes the last turn's block
    if fam.fmt == "mistral":
        assert parsed.calls[0].id == CALC.id  # the id the tool's result names


@pytest.mark.parametrize("name", sorted(n for n, f in FAMILIES.items() if f.parallel))
def test_two_calls_with_typed_arguments_round_trip(name: str) -> None:
    fam = FAMILIES[name]
    content = "I will compute it and look up the weather." if fam.content_with_calls else ""
    parsed = round_trip(fam, HISTORY, assistant(fam, (CALC, WEATHER), content))
    assert parsed.calls == (CALC, WEATHER)  # days stays an int, options an object (Qwen3-Coder: from the schema)
    assert parsed.content == content


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_an_answer_round_trips_and_is_an_answer(name: str) -> None:
    fam = FAMILIES[name]
    history = [*HISTORY, assistant(fam, (CALC,)), {"role": "tool", "content": "18272727", "tool_call_id": CALC.id}]
    parsed = round_trip(fam, history, assistant(fam, (), "48213*379 = 18272727."))
    assert parsed.is_answer and parsed.content == "48213*379 = 18272727."


def test_qwen3_reasoning_is_separated_on_every_turn_after_the_query() -> None:
    fam = FAMILIES["qwen3"]
    first = round_trip(fam, HISTORY, assistant(fam, (CALC, WEATHER), "Two tools.", reasoning="I need both.\nFirst x."))
    assert first.reasoning_content == "I need both.\nFirst x." and first.content == "Two tools."
    assert first.calls == (CALC, WEATHER)
    history = [
        *HISTORY,
        from_parsed(fam, first),
        {"role": "tool", "content": "18272727"},
        {"role": "tool", "content": "sunny"},
    ]
    final = round_trip(fam, history, assistant(fam, (), "It is 18272727; sunny.", reasoning="Both came back."))
    assert (
        final.is_answer and final.reasoning_content == "Both came back." and final.content == "It is 18272727; sunny."
    )
    empty = round_trip(fam, HISTORY, assistant(fam, (CALC,)))  # the last turn's (empty) think block is written
    assert empty.reasoning_content == ""


def _sampled_text(fam: Family, history: list[dict], body: str) -> tuple[Any, list[int], list[int]]:
    """Prompt ids and the ids of ``body`` + end-of-turn as the model would sample them after the prompt."""
    tok = tokenizer(fam.template)
    prompt_text = tok.apply_chat_template(history, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    prompt = tok.encode(prompt_text, add_special_tokens=False)
    both = tok.encode(prompt_text + body + tok.eos_token, add_special_tokens=False)
    assert both[: len(prompt)] == prompt
    return tok, prompt, both[len(prompt) :]


@pytest.mark.parametrize("name", ["qwen3", "hermes", "deepseek_v3"])
def test_arguments_written_compactly_round_trip_through_their_own_text(name: str) -> None:
    """The model's own JSON text (not the canonical dump) is kept as ``raw_arguments``; a template given it
    as OpenAI's ``arguments`` string writes the same ids back."""
    fam = FAMILIES[name]
    compact = '{"expression":"48213*379"}'
    body = {
        "qwen3": f'<think>\n\n</think>\n\n<tool_call>\n{{"name": "calculator", "arguments": {compact}}}\n</tool_call>',
        "hermes": f'<tool_call>\n{{"name": "calculator", "arguments": {compact}}}\n</tool_call>',
        "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calculator\n```json\n"
        f"{compact}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    }[name]
    tok, prompt, sampled = _sampled_text(fam, HISTORY, body)
    parsed = parse_tool_calls(fam.fmt, tok.decode(sampled[:-1], skip_special_tokens=False), tools=SCHEMAS)
    assert parsed.calls == (CALC,) and parsed.calls[0].raw_arguments == compact
    msg = from_parsed(fam, parsed)
    msg["tool_calls"][0]["function"]["arguments"] = parsed.calls[0].raw_arguments  # OpenAI's string
    assert _ids(tok, [*HISTORY, msg])[: len(prompt) + len(sampled)] == prompt + sampled


def test_deepseek_r1_reasoning_opened_by_the_prompt() -> None:
    """R1's generation prompt opens ``<think>``; its template keeps only what follows ``</think>`` in the
    history, so the round trip is: reasoning parsed out, and the rest renders as the original message."""
    fam = Family("deepseek_r1", "deepseek_r1", args_as_text=True, no_content=None)
    tok = tokenizer(fam.template)
    history = HISTORY[1:]
    for calls, content in (((CALC, WEATHER), "Both tools."), ((), "It is 18272727.")):
        original = assistant(fam, calls, content)
        full = _ids(tok, [*history, original])
        turn_ids = full[len(_ids(tok, history)) :]  # what the template writes for the turn (calls, end)
        body = "Let me think.\nTwo steps.\n</think>\n\n" + tok.decode(turn_ids[:-1], skip_special_tokens=False)
        _, _, sampled = _sampled_text(fam, history, body)
        parsed = parse_tool_calls(fam.fmt, tok.decode(sampled[:-1], skip_special_tokens=False), tools=SCHEMAS)
        assert parsed.errors == () and parsed.calls == calls and parsed.content == content
        assert parsed.reasoning_content == "Let me think.\nTwo steps."
        assert _ids(tok, [*history, from_parsed(fam, parsed)]) == full
        assert sampled[-len(turn_ids) :] == turn_ids  # after the reasoning, the model's ids are the template's
    cut_short = parse_tool_calls("deepseek_r1", "Let me think. Still thinking")
    assert cut_short.reasoning_content == "Let me think. Still thinking" and cut_short.content == ""


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_formatted_call_is_the_templates_text_and_parses_back(name: str) -> None:
    fam = FAMILIES[name]
    tok = tokenizer(fam.template)
    rendered = tok.apply_chat_template([*HISTORY, assistant(fam, (CALC,))], tools=TOOLS, tokenize=False)
    # ``hermes`` writes the project's demonstrations (no newlines inside the tags, as it always has); the
    # Hermes template's call is the same text as Qwen3's, which ``qwen3`` writes
    text = format_tool_call("qwen3" if fam.fmt == "hermes" else fam.fmt, CALC)
    assert text in rendered
    assert parse_tool_calls(fam.fmt, text, tools=SCHEMAS).calls == (CALC,)
    assert parse_tool_calls(fam.fmt, format_tool_call(fam.fmt, CALC), tools=SCHEMAS).calls == (CALC,)
