"""The door over each model family's chat template (``tests/rollout/templates``, ``rollout.tools``' parsers): a
named ``tool_choice`` writes the family's own call opening (its control tokens as control tokens) and the model's
rest of the call comes back as that call; the reasoning of the families that write it is ``reasoning_content``,
streamed as its own delta, also when calls are not read; the record stays exact."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from asyncrl.rollout.openai_door import ChatDoor, call_opening
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.tools import ToolCall, format_tool_call
from tests.rollout.chat_templates import control_counts, family_tokenizer
from tests.rollout.scripted_engine import ScriptedEngine, Turn, exactness

TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Exact arithmetic.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
CALL = ToolCall("calculator", {"expression": "2*3"})
FAMILIES = {
    "hermes": "hermes",
    "qwen3": "qwen3",
    "qwen3_coder": "qwen3_coder",
    "json": "llama3",
    "mistral": "mistral",
    "deepseek_v3": "deepseek_v3",
    "deepseek_r1": "deepseek_r1",
}


def _door(fmt: str, tok: Any, turns: list[Turn]) -> tuple[ChatDoor, ScriptedEngine]:
    engine = ScriptedEngine({1: turns})
    door = ChatDoor(engine, tok, tool_format=fmt, end_of_turn_ids=(tok.eos_token_id,), open_sessions_on_call=False)
    door.open_session("s", SamplingParams(max_new_tokens=96, seed=1), 1024)
    return door, engine


def _ids(tok: Any, text: str) -> tuple[int, ...]:
    return (*tok.encode(text, add_special_tokens=False), tok.eos_token_id)


@pytest.mark.parametrize("fmt", sorted(FAMILIES))
def test_a_named_tool_choice_writes_the_familys_opening(fmt: str) -> None:
    tok = family_tokenizer(FAMILIES[fmt])
    whole = format_tool_call(fmt, CALL)
    opening = call_opening(fmt, "calculator")
    assert whole.startswith(opening) and len(opening) < len(whole)
    door, engine = _door(fmt, tok, [Turn(_ids(tok, whole[len(opening) :]))])
    named = {"type": "function", "function": {"name": "calculator"}}
    body = {"messages": [{"role": "user", "content": "2*3?"}], "tools": [TOOL], "tool_choice": named}
    r = asyncio.run(door.chat(body, "s"))
    message = r["choices"][0]["message"]
    assert r["choices"][0]["finish_reason"] == "tool_calls", message
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "calculator" and json.loads(call["function"]["arguments"]) == CALL.arguments
    (sent,) = engine.calls
    lead = tuple(tok.encode(opening, add_special_tokens=False))
    assert sent.input_ids[-len(lead) :] == lead
    if fmt.startswith("deepseek"):  # the family's call tokens are its control tokens, not their characters
        assert control_counts(tok, lead)["<｜tool▁calls▁begin｜>"] == 1
    traj = door.store.end("s", None).trajectory()
    assert exactness(traj, engine.calls)["mismatches"] == 0 and traj.turns[0].tool_calls == ("calculator",)


@pytest.mark.parametrize("fmt", ["qwen3", "deepseek_r1"])
def test_reasoning_is_separated_and_streamed(fmt: str) -> None:
    tok = family_tokenizer(FAMILIES[fmt])
    think = "<think>\nsix, surely\n</think>\n\n" if fmt == "qwen3" else "six, surely\n</think>\n\n"
    door, engine = _door(
        fmt, tok, [Turn(_ids(tok, think + format_tool_call(fmt, CALL))), Turn(_ids(tok, think + "It is 6."))]
    )
    messages: list = [{"role": "user", "content": "2*3?"}]
    r = asyncio.run(door.chat({"messages": messages, "tools": [TOOL]}, "s"))
    message = r["choices"][0]["message"]
    assert message["reasoning_content"] == "six, surely" and message["content"] is None
    assert message["tool_calls"][0]["function"]["name"] == "calculator"
    tool = {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "6"}
    body = {"messages": [*messages, message, tool], "stream": True}  # no tools: calls not read, reasoning still

    async def events() -> list[dict]:
        stream = await door.chat(body, "s")
        return [json.loads(e[6:]) async for e in stream.chunks if e != b"data: [DONE]\n\n"]

    deltas = [c["choices"][0]["delta"] for c in asyncio.run(events())]
    assert {"reasoning_content": "six, surely"} in deltas
    assert "".join(d.get("content") or "" for d in deltas) == "It is 6."
    traj = door.store.end("s", None).trajectory()
    assert exactness(traj, engine.calls)["mismatches"] == 0
