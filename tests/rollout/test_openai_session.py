"""Sessions of the OpenAI door (``rollout.openai_session`` through ``openai_door.ChatDoor``), on a scripted
engine: every call recorded; the trained ids are the engine's ids across turns (the glue rendered by
``ChatRenderer.env_ids``, nothing re-tokenised), behaviour log-probs and versions equal, the loss mask on
exactly the engine's tokens; a call that does not extend the conversation is refused."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable
from typing import Any

import pytest

from asyncrl.rollout import openai_session
from asyncrl.rollout.chat import ChatRenderer
from asyncrl.rollout.envs.base import Message
from asyncrl.rollout.openai_door import ChatDoor
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.web import HTTPError
from tests.rollout.chat_templates import qwen_tokenizer
from tests.rollout.scripted_engine import ScriptedEngine, Turn, exactness

TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "48213*379"}}</tool_call>'


@pytest.fixture(scope="module")
def tok():
    return qwen_tokenizer()


def _ids(tok, text: str, close: bool = True) -> tuple[int, ...]:
    ids = tuple(tok.encode(text, add_special_tokens=False))
    return ids + ((tok.eos_token_id,) if close else ())


def _door(tok, turns: list[Turn], max_tokens: int | None = None) -> tuple[ChatDoor, ScriptedEngine, str]:
    engine = ScriptedEngine({7: turns})
    door = ChatDoor(engine, tok, end_of_turn_ids=(tok.eos_token_id,), open_sessions_on_call=False)
    door.open_session("s1", SamplingParams(max_new_tokens=64, seed=7), max_tokens)
    return door, engine, "s1"


class _Clock:
    """The session module's ``time``: ``monotonic`` reads the given ticks in turn, the rest is real."""

    def __init__(self, ticks: Iterable[float]) -> None:
        self.ticks = iter(ticks)

    def monotonic(self) -> float:
        return next(self.ticks)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def _play(door: ChatDoor, body_messages: list, *, tools=(TOOL,), **extra):
    body = {"model": "m", "messages": body_messages, "tools": list(tools), **extra}
    return asyncio.run(door.chat(body, "s1"))


def test_a_tool_session_is_exact_across_turns(tok, monkeypatch) -> None:
    # monotonic ticks: call 1 planned, recorded (its reply leaves); call 2 planned (arrives), recorded
    monkeypatch.setattr(openai_session, "time", _Clock([99.0, 100.0, 103.5, 110.0]))
    first = _ids(tok, CALL)
    # a weight update lands inside the answer turn (abort after 3 tokens: the door resumes it)
    answer = _ids(tok, "The product is 18272727. #18272727")
    versions = (1,) * 3 + (2,) * (len(answer) - 3)
    door, engine, sid = _door(tok, [Turn(first, 1), Turn(answer, versions, abort_after=(3,))])
    messages: list = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "What is 48213*379?"}]
    r1 = _play(door, messages, logprobs=True)
    choice = r1["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": "48213*379"}
    # the reply's log-probs are the engine's (the closing <|im_end|> is not content)
    assert [c["logprob"] for c in choice["logprobs"]["content"]] == list(engine.calls[0].output.behav_logprobs[:-1])
    assert r1["usage"]["completion_tokens"] == len(first)

    back = {**choice["message"], "refusal": None}  # what an openai client sends back
    tool_msg = {"role": "tool", "tool_call_id": call["id"], "content": "18272727"}
    r2 = _play(door, [*messages, back, tool_msg])
    assert r2["choices"][0]["finish_reason"] == "stop"
    assert r2["choices"][0]["message"]["content"] == "The product is 18272727. #18272727"

    session = door.store.end("s1", 1.0)
    traj = session.trajectory()
    report = exactness(traj, engine.calls)
    assert report["mismatches"] == 0 and report["mask_errors"] == 0, report
    assert report["logprob_errors"] == 0 and report["version_errors"] == 0, report
    assert report["engine_tokens"] == len(first) + len(answer)
    # the second call's input: opening + first turn as sampled + the template's glue for the tool result
    renderer = ChatRenderer(tok, (tok.eos_token_id,))
    opening = renderer.opening_ids([Message(m["role"], m["content"]) for m in messages], (TOOL,))
    glue = renderer.env_ids([Message(m["role"], m["content"]) for m in messages], [Message("tool", "18272727")],
                            (TOOL,), closed_by=tok.eos_token_id)  # fmt: skip
    assert engine.calls[1].input_ids == opening + first + glue
    assert traj.token_ids == opening + first + glue + answer
    assert traj.versions[-len(answer) :] == versions and traj.model_segments[1].num_interruptions == 1
    turn1, turn2 = traj.turns
    assert turn1.tool_calls == ("calculator",) and turn1.env_tokens == len(glue) and turn1.tool_latency_s == 3.5
    assert traj.end == "answer" and traj.env_reward == 1.0
    assert door.store.get("s1").summary()["loss_mask"] == list(traj.loss_mask)


def test_calls_that_do_not_extend_the_conversation_are_refused(tok) -> None:
    door, _, _ = _door(tok, [Turn(_ids(tok, "#1")), Turn(_ids(tok, "#2"))])
    messages = [{"role": "user", "content": "1?"}]
    reply = _play(door, messages)["choices"][0]["message"]
    for bad, reason in [
        ([{"role": "user", "content": "2?"}], "differs from the recorded conversation"),
        ([*messages, {"role": "assistant", "content": "#7"}, {"role": "user", "content": "and?"}], "differs"),
        ([*messages, reply, {"role": "assistant", "content": "prefill"}], "assistant turn the model did not write"),
    ]:
        with pytest.raises(HTTPError, match=reason) as e:
            _play(door, bad)
        assert e.value.status == 400
    with pytest.raises(HTTPError, match="tools changed"):
        _play(door, [*messages, reply, {"role": "user", "content": "and?"}], tools=())
    with pytest.raises(HTTPError, match="n must be 1"):
        _play(door, [*messages, reply, {"role": "user", "content": "and?"}], n=2)
    _play(door, [*messages, reply, {"role": "user", "content": "and?"}])  # extending it still works
    door.store.end("s1", None)
    with pytest.raises(HTTPError, match="has ended"):
        _play(door, messages)
    with pytest.raises(HTTPError) as unknown:
        asyncio.run(door.chat({"messages": messages}, "nobody"))
    assert unknown.value.status == 404  # this door's sessions are opened by its workflow


def test_the_session_budget_caps_turns_and_then_refuses(tok) -> None:
    long_turn = _ids(tok, "one two three four five six seven eight nine ten", close=False)
    door, engine, _ = _door(tok, [Turn(long_turn)], max_tokens=4)
    r = _play(door, [{"role": "user", "content": "count"}])
    assert r["choices"][0]["finish_reason"] == "length" and engine.calls[0].sampling.max_new_tokens == 4
    with pytest.raises(HTTPError, match="budget"):
        _play(
            door, [{"role": "user", "content": "count"}, r["choices"][0]["message"], {"role": "user", "content": "go"}]
        )
    assert door.store.end("s1", None).trajectory().end == "length"


def test_the_session_sampling_governs_and_stop_strings_end_turns(tok) -> None:
    close = tok.encode("</tool_call>", add_special_tokens=False)
    door, engine, _ = _door(tok, [Turn(_ids(tok, "<tool_call>x", close=False) + tuple(close))])
    r = _play(door, [{"role": "user", "content": "hi"}], temperature=0.0, top_p=0.5, stop="</tool_call>")
    sampling = engine.calls[0].sampling
    assert sampling.seed == 7 and sampling.temperature == 1.0 and sampling.top_p == 1.0  # the session's
    assert set(close) <= set(sampling.stop_token_ids) and tok.eos_token_id in sampling.stop_token_ids
    assert r["choices"][0]["message"]["content"] == "<tool_call>x"  # the stop string is not content
