"""Tool-call parsing: the Hermes/Qwen, tag and json formats, and malformed calls reported, not dropped."""

from __future__ import annotations

import pytest

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
    for fmt in ("hermes", "tag", "json"):
        assert parse_tool_calls(fmt, "The answer is #42", TAGS).is_answer


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
    assert close_tags("hermes") == ("</tool_call>",)
    assert close_tags("tag", ("calc",)) == ("</calc>",)
    assert close_tags("json") == ()


def test_a_formatted_call_parses_back_to_itself() -> None:
    call = ToolCall("calculator", {"expression": "48213*379"})
    for fmt in ("hermes", "tag", "json"):
        text = format_tool_call(fmt, call, "calc")
        assert parse_tool_calls(fmt, text, {"calc": ("calculator", "expression")}).calls == (call,), (fmt, text)
    assert format_tool_call("tag", call, "calc") == "<calc>48213*379</calc>"
    with pytest.raises(ValueError, match="tag"):
        format_tool_call("tag", call)
