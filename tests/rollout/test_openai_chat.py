"""``rollout.openai_chat``: request validation (every refusal a 400 with its reason, the size cap), the message
normalisation a session compares with, tool calls written back into text, and the reply's shape."""

from __future__ import annotations

import json

import pytest

from asyncrl.rollout.openai_chat import (
    assistant_reply,
    completion_response,
    models_response,
    normalized,
    same_message,
    template_messages,
    tool_tags,
)
from asyncrl.rollout.openai_request import parse_chat_request
from asyncrl.rollout.tools import parse_tool_calls
from asyncrl.web import HTTPError
from tests.rollout.chat_templates import qwen_tokenizer

TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


@pytest.fixture(scope="module")
def tok():
    return qwen_tokenizer()


def _parse(tok, **body):
    return parse_chat_request({"messages": [{"role": "user", "content": "hi"}], **body}, tokenizer=tok, max_slots=8)


def test_a_full_request_is_read(tok) -> None:
    req = _parse(
        tok,
        model="m",
        tools=[TOOL],
        temperature=0.5,
        top_p=0.9,
        max_tokens=7,
        stop=["</tool_call>"],
        n=2,
        seed=3,
        logprobs=True,
        tool_choice="auto",
        user="u",
        top_logprobs=0,
    )
    assert (req.model, req.max_tokens, req.temperature, req.top_p, req.n, req.seed) == ("m", 7, 0.5, 0.9, 2, 3)
    assert req.logprobs and req.tools == (TOOL,)
    assert req.stop_ids == tuple(tok.encode("</tool_call>", add_special_tokens=False))
    assert _parse(tok, max_completion_tokens=5).max_tokens == 5
    none = _parse(tok, tools=[TOOL], tool_choice="none")  # the tools stay rendered; calls are not read
    assert none.tools == (TOOL,) and none.tool_choice == "none"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"stream_options": {"include_usage": True}}, "only allowed with stream=true"),
        ({"stream": True, "stream_options": {"include_usage": 1}}, "include_usage"),
        ({"stream": "yes"}, "'stream' must be a bool"),
        ({"temperature": 3}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 9}, "n must be"),
        ({"seed": 1.5}, "seed"),
        ({"stop": "the end"}, "single-token"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"tool_choice": "required"}, "tool_choice='required' needs tools"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "search"}}}, "not one of"),
        ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice must be"),
        ({"tools": [{"type": "function", "function": {"name": "f", "strict": True}}]}, "strict=true"),
        ({"top_logprobs": 3, "logprobs": True}, "the engine returns the sampled token's log-prob"),
        ({"functions": []}, "deprecated by OpenAI: use tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"functionz": []}, "unsupported fields"),
        ({"tools": [{"type": "web"}]}, r"tools\[0\]"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "text content"),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]},
            "JSON string",
        ),
        # each of these was a 500 (an AttributeError, a TypeError from the tokenizer) before
        ({"tools": [1]}, r"tools\[0\] must be"),
        ({"tools": [{"function": {"name": "f", "parameters": {"required": 5}}}]}, r"required must be a list"),
        ({"tools": [{"function": {"name": "f", "parameters": {"properties": []}}}]}, r"properties must be an object"),
        ({"messages": [{"role": "user", "content": "a\ud800"}]}, r"messages\[0\]\.content is not valid Unicode"),
        ({"stop": "\udfff"}, "lone surrogate"),
        ({"stop": "x" * 300}, "at most 256 characters"),
        ({"model": 5}, "'model' must be a string"),
    ],
)
def test_bad_requests_are_400_with_the_reason(tok, body, reason) -> None:
    with pytest.raises(HTTPError, match=reason) as e:
        _parse(tok, **body)
    assert e.value.status == 400
    with pytest.raises(HTTPError):
        parse_chat_request([], tokenizer=tok, max_slots=8)


def test_the_request_size_is_capped_before_tokenising(tok) -> None:
    """Message text, call arguments and the tools' JSON count towards ``max_chars``; past it, 400 naming it."""
    body = {"messages": [{"role": "user", "content": "x" * 60}], "tools": [TOOL]}
    chars = 60 + len(json.dumps([TOOL]))
    assert parse_chat_request(body, tokenizer=tok, max_slots=8, max_chars=chars).messages
    with pytest.raises(HTTPError, match=f"hold {chars + 1} characters; this server reads at most {chars}") as e:
        body["messages"][0]["content"] += "y"
        parse_chat_request(body, tokenizer=tok, max_slots=8, max_chars=chars)
    assert e.value.status == 400


def test_a_message_sent_back_is_recognised_whatever_the_client_adds() -> None:
    fn = {"name": "calculator", "arguments": '{"expression": "1+2"}'}
    sent = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": fn}]}
    back = {**sent, "refusal": None, "annotations": [], "audio": None, "function_call": None}
    back["tool_calls"] = [
        {**sent["tool_calls"][0], "function": {"name": "calculator", "arguments": '{"expression":"1+2"}'}}
    ]
    assert same_message(normalized(sent), normalized(back))  # extra fields, JSON spacing
    other = {
        **back,
        "tool_calls": [{"id": "x", "function": {"name": "calculator", "arguments": '{"expression": "1+3"}'}}],
    }
    assert not same_message(normalized(sent), normalized(other))
    assert same_message(
        normalized({"role": "user", "content": [{"type": "text", "text": "hi"}]}),
        normalized({"role": "user", "content": "hi"}),
    )


def test_tool_calls_are_written_back_in_the_call_format() -> None:
    fn = {"name": "calculator", "arguments": '{"expression": "2*3"}'}
    m = normalized(
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": fn}]}
    )
    tags = tool_tags((TOOL,))
    assert tags == {"calculator": ("calculator", "expression")}
    for fmt in ("hermes", "tag", "json"):
        (msg,) = template_messages((m,), fmt, tags)
        parsed = parse_tool_calls(fmt, msg.content, tags)
        assert [(c.name, c.arguments) for c in parsed.calls] == [("calculator", {"expression": "2*3"})], fmt
    texts = {fmt: template_messages((m,), fmt, tags)[0].content for fmt in ("hermes", "tag", "json")}
    assert texts == {
        "hermes": '<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>',
        "tag": "<calculator>2*3</calculator>",
        "json": '{"name": "calculator", "parameters": {"expression": "2*3"}}',
    }
    unknown = normalized(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "other", "arguments": '{"x": 1}'}}],
        }
    )
    assert template_messages((unknown,), "tag", tags)[0].content == "<other></other>"  # no parameter known: empty
    (dev,) = template_messages((normalized({"role": "developer", "content": "be brief"}),), "hermes", {})
    assert dev.role == "system"


def test_the_reply_has_openai_shapes() -> None:
    text = 'Let me compute.<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>'
    reply = assistant_reply(text, parse_tool_calls("hermes", text), False, "hermes", {})
    assert reply.finish_reason == "tool_calls"
    assert reply.message["content"] == "Let me compute."
    (call,) = reply.message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "calculator" and json.loads(call["function"]["arguments"]) == {
        "expression": "2*3"
    }
    plain = assistant_reply("#6", parse_tool_calls("hermes", "#6"), False, "hermes", {})
    assert plain.message == {"role": "assistant", "content": "#6"} and plain.finish_reason == "stop"
    assert assistant_reply("#", parse_tool_calls("hermes", "#"), True, "hermes", {}).finish_reason == "length"
    broken = "<tool_call>{not json}</tool_call>"
    bad = assistant_reply(broken, parse_tool_calls("hermes", broken), False, "hermes", {})
    assert bad.message["content"] == broken and "tool_calls" not in bad.message  # malformed: the model's text
    env = completion_response("m", [{"index": 0, "message": plain.message, "finish_reason": "stop"}], 5, 2)
    assert env["object"] == "chat.completion" and env["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 2,
        "total_tokens": 7,
    }
    assert models_response("m")["data"][0]["id"] == "m"
