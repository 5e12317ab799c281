"""Tool-call parsing: every format's calls, content and reasoning, and malformed calls reported as text with a
reason, never dropped and never raised (the families' templates: ``test_tool_families.py``)."""

from __future__ import annotations

from typing import get_args

import pytest

from asyncrl.choices import ToolFormat
from asyncrl.rollout.tools import ToolCall, close_tags, format_tool_call, parse_tool_calls

TAGS = {"calc": ("calculator", "expression"), "python": ("python", "code")}


def test_hermes_calls_in_order_with_text_around() -> None:
    text = (
        'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>\n'
        '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>'
    )
    parsed = parse_tool_calls("hermes", text)
    assert parsed.calls == (ToolCall("calculator", {"expression": "2*3"}), ToolCall("python", {"code": "print(1)"}))
    assert parsed.errors == () and not parsed.is_answer


def test_hermes_malformed_calls_are_errors() -> None:
    cases = {
        "<tool_call>{name: x}</tool_call>": "not valid JSON",
        "<tool_call>[1, 2]</tool_call>": "JSON object",
        '<tool_call>{"arguments": {}}</tool_call>': "no `name`",
        '<tool_call>{"name": "f", "arguments": 3}</tool_call>': "not a JSON object",
        '<tool_call>{"name": "f", "arguments": {}}': "not closed",
        "the answer </tool_call>": "without <tool_call>",
    }
    for text, message in cases.items():
        parsed = parse_tool_calls("hermes", text)
        assert parsed.calls == () and len(parsed.errors) == 1 and message in parsed.errors[0], text


def test_plain_text_is_an_answer() -> None:
    for fmt in get_args(ToolFormat):
        parsed = parse_tool_calls(fmt, "The answer is #42", TAGS)
        assert parsed.is_answer, fmt
        if fmt == "deepseek_r1":  # R1's prompt opens <think>: text never closed is reasoning cut short
            assert parsed.content == "" and parsed.reasoning_content == "The answer is #42"
        else:
            assert parsed.content == "The answer is #42" and parsed.reasoning_content is None, fmt


def test_tag_format() -> None:
    parsed = parse_tool_calls("tag", "<calc>48213*379</calc> then <python>print(2)</python>", TAGS)
    assert parsed.calls == (
        ToolCall("calculator", {"expression": "48213*379"}),
        ToolCall("python", {"code": "print(2)"}),
    )
    assert parse_tool_calls("tag", "<calc>12*3", TAGS).errors == ("<calc> is not closed by </calc>",)
    assert parse_tool_calls("tag", "12*3</calc>", TAGS).errors == ("</calc> without <calc>",)
    assert parse_tool_calls("tag", "<weather>x</weather>", TAGS).is_answer  # not a tool's tag: text
    assert parse_tool_calls("tag", "<calc>1</calc>", None).is_answer  # no tools, no calls


def test_json_format() -> None:
    parsed = parse_tool_calls("json", ' {"name": "calculator", "parameters": {"expression": "1+1"}}')
    assert parsed.calls == (ToolCall("calculator", {"expression": "1+1"}),)
    assert "not valid JSON" in parse_tool_calls("json", '{"name": "calculator", ').errors[0]


def test_close_tags() -> None:
    assert close_tags("hermes") == close_tags("qwen3") == close_tags("qwen3_coder") == ("</tool_call>",)
    assert close_tags("tag", ("calc",)) == ("</calc>",)
    assert close_tags("json") == close_tags("mistral") == ()
    assert close_tags("deepseek_v3") == close_tags("deepseek_r1") == ("<｜tool▁calls▁end｜>",)


def test_a_formatted_call_parses_back_to_itself() -> None:
    call = ToolCall("calculator", {"expression": "48213*379"})
    for fmt in get_args(ToolFormat):
        text = format_tool_call(fmt, call, "calc")
        assert parse_tool_calls(fmt, text, {"calc": ("calculator", "expression")}).calls == (call,), (fmt, text)
    assert format_tool_call("tag", call, "calc") == "<calc>48213*379</calc>"
    with pytest.raises(ValueError, match="tag"):
        format_tool_call("tag", call)


SCHEMAS = {"calculator": {"type": "object", "properties": {"expression": {"type": "string"}}}}
MALFORMED: dict[ToolFormat, dict[str, str]] = {
    "hermes": {'<tool_call>{"name": "calculator", "arguments": {"expression": 1+}}</tool_call>': "not valid JSON"},
    "qwen3": {
        '<think>\nhm\n</think>\n\n<tool_call>\n{"name": "weather", "arguments": {}}\n</tool_call>': "unknown tool",
        '<think>\nhm\n</think>\n\n<tool_call>\n{"name": "calculator"': "not closed",
    },
    "qwen3_coder": {
        "<tool_call>\n<function=calculator>\n<parameter=expression>\n1+1\n</function>\n</tool_call>": "not closed",
        '<tool_call>\n{"name": "calculator"}\n</tool_call>': "<function=NAME>",
        "<tool_call>\n<function=shell>\n</function>\n</tool_call>": "unknown tool",
    },
    "json": {
        '<|python_tag|>{"name": "calculator", "parameters": ': "not valid JSON",
        '{"name": "calculator", "parameters": {"expression": "1"}} and then': "text after the JSON",
        '{"name": "rm", "parameters": {}}': "unknown tool",
    },
    "mistral": {
        '[TOOL_CALLS] [{"name": "calculator", "arguments": {"expression": "1"}': "not valid JSON",
        '[TOOL_CALLS] [{"arguments": {}}]': "no `name`",
        '[TOOL_CALLS] [{"name": "calculator", "arguments": "1+1"}]': "not a JSON object",
    },
    "deepseek_v3": {
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calculator\n```json\n{1}\n```"
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>": "not valid JSON",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calculator\n```json\n{}": "not closed",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calculator {}<｜tool▁calls▁end｜>": "```json",
    },
}


@pytest.mark.parametrize("fmt", sorted(MALFORMED))
def test_malformed_calls_come_back_as_text_with_a_reason(fmt: ToolFormat) -> None:
    for text, reason in MALFORMED[fmt].items():
        parsed = parse_tool_calls(fmt, text, tools=SCHEMAS)
        assert len(parsed.errors) == 1 and reason in parsed.errors[0], (text, parsed.errors)
        assert not parsed.is_answer and text.endswith(parsed.content or "?"), parsed  # the text, less reasoning
    assert parse_tool_calls(fmt, next(iter(MALFORMED[fmt])), tools=SCHEMAS).calls == ()


def test_an_unknown_tool_beside_a_known_one_is_reported_and_the_known_one_kept() -> None:
    text = '<tool_call>{"name": "calculator", "arguments": {}}</tool_call><tool_call>{"name": "rm"}</tool_call>'
    parsed = parse_tool_calls("hermes", text, tools=SCHEMAS)
    assert parsed.calls == (ToolCall("calculator"),)
    assert parsed.errors == ("unknown tool 'rm' (the tools are: calculator)",) and parsed.content == text
    assert parse_tool_calls("hermes", text).errors == ()  # no tools given: no check


def test_no_prefix_of_a_turn_makes_a_parser_raise() -> None:
    turns = {
        "qwen3": '<think>\nx\n</think>\n\nA\n<tool_call>\n{"name": "calculator", "arguments": {"e": [1]}}\n'
        "</tool_call>",
        "qwen3_coder": 'A\n\n<tool_call>\n<function=calculator>\n<parameter=e>\n{"a": 1}\n</parameter>\n'
        "</function>\n</tool_call>",
        "json": '<|python_tag|>{"name": "calculator", "parameters": {"e": "1"}}; {"name": "x", "parameters": {}}',
        "mistral": '[TOOL_CALLS] [{"name": "calculator", "arguments": {"e": "1"}, "id": "abcdefghi"}]',
        "deepseek_r1": "x</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calculator"
        '\n```json\n{"e": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "tag": "<calc>1+2</calc>",
    }
    for fmt, turn in turns.items():
        for end in range(len(turn) + 1):
            parsed = parse_tool_calls(fmt, turn[:end], TAGS, tools=SCHEMAS | {"x": {}})
            assert parsed.content is not None
        assert parsed.calls and not parsed.errors, (fmt, parsed)


def test_qwen3_coder_values_take_their_type_from_the_schema() -> None:
    types = {"n": "integer", "x": "number", "b": "boolean", "o": "array", "s": "string", "z": "integer"}
    schema = {"f": {"properties": {k: {"type": v} for k, v in types.items()}}}
    params = {"n": "12", "x": "2.5", "b": "false", "o": "[1, 2]", "s": "007", "z": "many"}
    text = "<tool_call>\n<function=f>\n" + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    text += "</function>\n</tool_call>"
    typed = parse_tool_calls("qwen3_coder", text, tools=schema).calls[0].arguments
    assert typed == {"n": 12, "x": 2.5, "b": False, "o": [1, 2], "s": "007", "z": "many"}  # "many": kept as text
    assert parse_tool_calls("qwen3_coder", text).calls[0].arguments == params  # no schema: the text


def test_llama_calls_separated_by_semicolons_and_mistral_ids() -> None:
    text = '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {}}'
    assert parse_tool_calls("json", text).calls == (ToolCall("a", {"x": 1}), ToolCall("b"))
    mistral = parse_tool_calls("mistral", 'Sure.[TOOL_CALLS] [{"name": "a", "arguments": {}, "id": "abcdefghi"}]')
    assert mistral.calls[0].id == "abcdefghi" and mistral.content == "Sure."
    later = parse_tool_calls("mistral", '[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b{}')  # v11+ tokenizers
    assert later.calls == (ToolCall("a", {"x": 1}), ToolCall("b")) and later.errors == ()
    assert "not valid JSON" in parse_tool_calls("mistral", '[TOOL_CALLS]a[ARGS]{"x": 1} and').errors[0]
    made = format_tool_call("mistral", ToolCall("a", {"x": 1}))
    assert made == format_tool_call("mistral", ToolCall("a", {"x": 1}))  # the derived id is the same each time
    (call,) = parse_tool_calls("mistral", made).calls
    assert len(call.id) == 9 and call.id.isalnum()


def test_reasoning_cut_short_and_thinking_off() -> None:
    assert parse_tool_calls("qwen3", "<think>\nstill going").reasoning_content == "still going"
    off = parse_tool_calls("qwen3", "The answer is 4.")  # thinking off: the prompt held the empty block
    assert off.reasoning_content is None and off.content == "The answer is 4." and off.is_answer
    assert parse_tool_calls("hermes", "<think>x</think>y").reasoning_content is None  # hermes does not reason
