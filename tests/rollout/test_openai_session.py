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
    body = {"model": "asyncrl", "messages": body_messages, "tools": list(tools), **extra}
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
    glue = renderer.env_ids(
        [Message(m["role"], m["content"]) for m in messages],
        [Message("tool", "18272727")],
        (TOOL,),
        closed_by=tok.eos_token_id,
    )
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
    other = {"type": "function", "function": {"name": "search"}}
    with pytest.raises(HTTPError, match="tools changed"):  # other tools; none at all is a final answer's call
        _play(door, [*messages, reply, {"role": "user", "content": "and?"}], tools=(TOOL, other))
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


def test_the_sessions_max_new_tokens_is_a_cap_on_max_tokens(tok) -> None:
    """A session opened with sampling (a workflow's: ``agent.max_turn_tokens``) caps each call: a larger
    ``max_tokens`` is lowered to it, a smaller one kept (was: the request's won, 64-token turns under a cap of 8)."""
    long_turn = _ids(tok, "one two three four five six seven eight nine ten eleven twelve", close=False)
    engine = ScriptedEngine({7: [Turn(long_turn), Turn(long_turn)]})
    door = ChatDoor(engine, tok, end_of_turn_ids=(tok.eos_token_id,), open_sessions_on_call=False)
    door.open_session("s1", SamplingParams(max_new_tokens=8, seed=7), None)
    first = [{"role": "user", "content": "count"}]
    r = _play(door, first, max_tokens=64)
    assert engine.calls[0].sampling.max_new_tokens == 8 and r["usage"]["completion_tokens"] == 8
    assert r["choices"][0]["finish_reason"] == "length"
    _play(door, [*first, r["choices"][0]["message"], {"role": "user", "content": "more"}], max_tokens=3)
    assert engine.calls[1].sampling.max_new_tokens == 3


class _Now:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _server_door(tok, clock: _Now, **bounds) -> ChatDoor:
    engine = ScriptedEngine({})
    return ChatDoor(engine, tok, end_of_turn_ids=(tok.eos_token_id,), clock=clock, **bounds)


def test_open_sessions_expire_and_are_evicted_and_then_answer_404(tok) -> None:
    """A server's sessions: idle past the TTL they expire, past the count cap the least recently used idle
    one is evicted; either way its id then answers 404 saying why (chat, end, record), never a new session."""
    now = _Now()
    door = _server_door(tok, now, max_open_sessions=2, session_ttl_s=60.0)
    door.open_session("a")
    now.t = 10.0
    door.open_session("b")
    now.t = 20.0
    door.store.touch(door.store.open["a"])  # a call of "a": "b" is now the least recently used
    door.open_session("c")
    assert list(door.store.open) == ["a", "c"] and door.store.evicted == 1
    body = {"model": "asyncrl", "messages": [{"role": "user", "content": "hi"}]}
    for attempt in (door.chat(body, "b"), door.end_session("b", None), door.session_record("b")):
        with pytest.raises(HTTPError, match="b was evicted: this server holds at most 2 open sessions") as e:
            asyncio.run(attempt)
        assert e.value.status == 404
    now.t = 79.0  # "a" was last used at 20, "c" opened at 20: neither idle past 60 s yet
    assert door.store.expire() == 0
    door.store.open["c"].busy = True  # a call of "c" is running: never dropped
    now.t = 81.0
    with pytest.raises(HTTPError, match="a expired: it had no call for more than 60 s") as e:
        asyncio.run(door.chat(body, "a"))
    assert e.value.status == 404 and list(door.store.open) == ["c"] and door.store.expired == 1
    door.open_session("d")
    with pytest.raises(HTTPError, match="at most 2 open sessions and each has a call running") as e:
        door.store.open["d"].busy = True
        door.open_session("e")
    assert e.value.status == 429

    unbounded = _server_door(tok, now)  # a workflow's door: it ends its sessions itself
    for i in range(50):
        unbounded.open_session(f"s{i}")
    now.t = 1e9
    assert unbounded.store.expire() == 0 and len(unbounded.store.open) == 50
