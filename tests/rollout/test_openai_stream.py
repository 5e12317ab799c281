"""The door for agent code (``rollout.openai_door``) on a scripted engine: ``stream=true`` read by the real
``openai`` client (text token by token, tool calls, ``include_usage``, log-probs in the chunks) equals the
non-streamed reply and keeps the session exact; ``tool_choice`` required or named writes the call's opening
as environment tokens; ``none`` and a later call without ``tools`` leave calls unread over the same recorded
tokens; ``parallel_tool_calls=false`` returns one call (and stops at a one-token close); ``bytes`` are each
token's raw bytes, partial UTF-8 included."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from asyncrl.rollout.chat import ChatRenderer
from asyncrl.rollout.envs.base import Message
from asyncrl.rollout.openai_chat import TokenBytes, text_pieces
from asyncrl.rollout.openai_door import ChatDoor, DoorServer
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.web import HTTPError
from tests.rollout.chat_templates import llama_tokenizer, qwen_tokenizer, tiny_tokenizer
from tests.rollout.scripted_engine import ScriptedEngine, Turn, exactness

openai = pytest.importorskip("openai")

TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
OTHER = {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "48213*379"}}</tool_call>'
ANSWER = "Le produit: 18 272 727 → #18272727 ✓ 🎉"  # multi-byte characters split across tokens


@pytest.fixture(scope="module")
def tok():
    return qwen_tokenizer()


def _ids(tok, text: str, close: bool = True) -> tuple[int, ...]:
    return tuple(tok.encode(text, add_special_tokens=False)) + ((tok.eos_token_id,) if close else ())


def _door(tok, scripts: dict[int, list[Turn]], fmt: str = "hermes") -> tuple[ChatDoor, ScriptedEngine]:
    engine = ScriptedEngine(scripts)
    door = ChatDoor(engine, tok, tool_format=fmt, end_of_turn_ids=(tok.eos_token_id,), open_sessions_on_call=False)
    for seed in scripts:
        door.open_session(f"s{seed}", SamplingParams(max_new_tokens=64, seed=seed), 512)
    return door, engine


def _streamed(client: Any, **kwargs: Any) -> dict[str, Any]:
    """A streamed completion joined as a client joins it: content, calls by index, log-probs, usage."""
    content, calls, entries, finish, usage, role = "", {}, [], None, None, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if chunk.usage is not None:
            assert not chunk.choices  # the usage chunk holds no choice
            usage = chunk.usage.model_dump()
        for choice in chunk.choices:
            role = role or choice.delta.role
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or ():
                calls[call.index] = call.model_dump()
            if choice.logprobs is not None:
                entries += [e.model_dump() for e in choice.logprobs.content or ()]
            finish = choice.finish_reason or finish
    return {
        "role": role,
        "content": content,
        "calls": [calls[k] for k in sorted(calls)],
        "entries": entries,
        "finish": finish,
        "usage": usage,
    }


def test_a_streamed_tool_session_equals_the_plain_one_and_stays_exact(tok) -> None:
    """Two sessions on the same script, one streamed (``include_usage``, ``logprobs``), one not: the same calls,
    content, log-probs (with each token's raw bytes) and usage; both records token-exact; the final answer's
    call drops ``tools``."""
    script = [Turn(_ids(tok, CALL)), Turn(_ids(tok, ANSWER))]
    door, engine = _door(tok, {1: script, 2: script})
    server = DoorServer(door, "k")
    seen: dict[str, list] = {"streamed": [], "plain": []}

    def agent(session: str, stream: bool) -> None:
        client = openai.OpenAI(base_url=server.base_url(session), api_key="k", max_retries=0)
        messages: list = [{"role": "user", "content": "What is 48213*379?"}]
        for tools in ([TOOL], None):
            ask = {"model": "asyncrl", "messages": messages, "logprobs": True} | ({"tools": tools} if tools else {})
            if stream:
                got = _streamed(client, stream_options={"include_usage": True}, **ask)
            else:
                r = client.chat.completions.create(**ask)
                msg = r.choices[0].message
                got = {
                    "role": msg.role,
                    "content": msg.content or "",
                    "calls": [{"index": k, **c.model_dump()} for k, c in enumerate(msg.tool_calls or ())],
                    "entries": [e.model_dump() for e in r.choices[0].logprobs.content],
                    "finish": r.choices[0].finish_reason,
                    "usage": r.usage.model_dump(),
                }
            seen["streamed" if stream else "plain"].append(got)
            call = got["calls"][0] if got["calls"] else None
            back = {"role": "assistant", "content": got["content"] or None}
            if call is not None:
                back["tool_calls"] = [{"id": call["id"], "type": "function", "function": call["function"]}]
            messages += [back, {"role": "tool", "tool_call_id": call["id"] if call else "", "content": "18272727"}]

    async def main() -> None:
        await server.start()
        try:
            await asyncio.to_thread(agent, "s1", True)
            await asyncio.to_thread(agent, "s2", False)
        finally:
            await server.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
    streamed, plain = seen["streamed"], seen["plain"]
    assert streamed[0]["finish"] == "tool_calls" and streamed[0]["role"] == "assistant"
    (call,) = streamed[0]["calls"]
    assert call["function"]["name"] == "calculator" and json.loads(call["function"]["arguments"]) == {
        "expression": "48213*379"
    }
    assert streamed[1]["content"] == ANSWER and streamed[1]["finish"] == "stop"
    for s, p in zip(streamed, plain, strict=True):
        for key in ("content", "finish", "usage", "entries"):
            assert s[key] == p[key], key
        assert [c["function"] for c in s["calls"]] == [c["function"] for c in p["calls"]]
    answer_bytes = b"".join(bytes(e["bytes"]) for e in streamed[1]["entries"])
    assert answer_bytes.decode("utf-8") == ANSWER  # each token's own bytes (was: U+FFFD's for partial ones)
    assert [239, 191, 189] not in [e["bytes"] for e in streamed[1]["entries"]]
    assert streamed[1]["usage"]["completion_tokens"] == len(script[1].ids)
    for seed in (1, 2):
        traj = door.store.end(f"s{seed}", None).trajectory()
        report = exactness(traj, [c for c in engine.calls if c.sampling.seed == seed])
        assert report["mismatches"] == report["mask_errors"] == report["logprob_errors"] == 0, report
        assert traj.turns[0].tool_calls == ("calculator",) and traj.end == "answer"


def test_raw_events_are_openai_server_sent_events(tok) -> None:
    door, _ = _door(tok, {3: [Turn(_ids(tok, "#6"))]})
    body = {"messages": [{"role": "user", "content": "2*3"}], "stream": True, "seed": 3, "max_tokens": 8}

    async def events() -> list[bytes]:
        stream = await door.chat(body, None)
        return [e async for e in stream.chunks]

    raw = asyncio.run(events())
    assert all(e.startswith(b"data: ") and e.endswith(b"\n\n") for e in raw) and raw[-1] == b"data: [DONE]\n\n"
    chunks = [json.loads(e[6:]) for e in raw[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "#6"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and "usage" not in chunks[-1]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "calculator"}}])
def test_a_required_or_named_tool_choice_writes_the_calls_opening(tok, choice) -> None:
    """The door writes ``<tool_call>{"name": "calculator", "arguments": `` after the generation prompt (environment
    tokens: no loss); the model writes the rest; the reply is that call; the record is exact."""
    rest = '{"expression": "6*7"}}</tool_call>'
    door, engine = _door(tok, {4: [Turn(_ids(tok, rest))]})
    body = {"messages": [{"role": "user", "content": "6*7"}], "tools": [TOOL], "tool_choice": choice}
    r = asyncio.run(door.chat(body, "s4"))
    choice0 = r["choices"][0]
    assert choice0["finish_reason"] == "tool_calls"
    assert json.loads(choice0["message"]["tool_calls"][0]["function"]["arguments"]) == {"expression": "6*7"}
    lead = tuple(tok.encode('<tool_call>{"name": "calculator", "arguments": ', add_special_tokens=False))
    (call,) = engine.calls
    assert call.input_ids[-len(lead) :] == lead
    traj = door.store.end("s4", None).trajectory()
    assert traj.prompt_ids == call.input_ids and sum(traj.loss_mask) == len(_ids(tok, rest))
    assert exactness(traj, engine.calls)["mismatches"] == 0


def test_what_a_tool_choice_cannot_guarantee_is_refused(tok) -> None:
    door, engine = _door(tok, {5: [Turn(_ids(tok, "nope"))]}, fmt="tag")
    ask = {"messages": [{"role": "user", "content": "x"}], "tools": [TOOL, OTHER], "tool_choice": "required"}
    with pytest.raises(HTTPError, match="the 'tag' format has no opening common to every call") as e:
        asyncio.run(door.chat(ask, "s5"))
    assert e.value.status == 400 and not engine.calls
    # a named tag is forced; what the model writes after it is its own: here not a call, so content
    r = asyncio.run(door.chat({**ask, "tool_choice": {"type": "function", "function": {"name": "calculator"}}}, "s5"))
    assert r["choices"][0]["message"] == {"role": "assistant", "content": "<calculator>nope"}
    assert r["choices"][0]["finish_reason"] == "stop"


def test_parallel_tool_calls_false_returns_one_call(tok) -> None:
    """Hermes (one-token ``</tool_call>``): the turn stops at the first call's close, and the next call's glue
    closes the turn for the model. Tag (a close of several tokens): the model's two calls are recorded, one is
    returned."""
    first = _ids(tok, CALL, close=False)  # a real engine stops here: </tool_call> is a stop token
    door, engine = _door(tok, {6: [Turn(first), Turn(_ids(tok, "#18272727"))]})
    messages: list = [{"role": "user", "content": "48213*379"}]
    body = {"messages": messages, "tools": [TOOL], "parallel_tool_calls": False}
    r = asyncio.run(door.chat(body, "s6"))
    assert tok.convert_tokens_to_ids("</tool_call>") in engine.calls[0].sampling.stop_token_ids
    (call,) = r["choices"][0]["message"]["tool_calls"]
    tool = {"role": "tool", "tool_call_id": call["id"], "content": "18272727"}
    asyncio.run(door.chat({**body, "messages": [*messages, r["choices"][0]["message"], tool]}, "s6"))
    traj = door.store.end("s6", None).trajectory()
    assert exactness(traj, engine.calls)["mismatches"] == 0
    glue = tok.decode(list(traj.segments[1].token_ids), skip_special_tokens=False)
    assert glue.startswith("<|im_end|>")  # the model did not close its turn: the template's close is glue

    two = "<calculator>1+1</calculator><calculator>2+2</calculator>"
    door, engine = _door(tok, {7: [Turn(_ids(tok, two))]}, fmt="tag")
    r = asyncio.run(door.chat({**body, "messages": messages}, "s7"))
    (call,) = r["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"expression": "1+1"}
    assert door.store.end("s7", None).trajectory().turns[0].tool_calls == ("calculator", "calculator")


@pytest.mark.parametrize("final", [{"tools": None}, {"tool_choice": "none"}])
def test_a_final_answer_without_tools_keeps_the_recorded_tokens(tok, final) -> None:
    """A later call drops ``tools`` (or says ``tool_choice="none"``): the glue is rendered with the session's tools
    (those the model saw in its opening), and a call the model writes anyway comes back as content."""
    door, engine = _door(tok, {8: [Turn(_ids(tok, CALL)), Turn(_ids(tok, CALL))]})
    messages: list = [{"role": "user", "content": "48213*379"}]
    r = asyncio.run(door.chat({"messages": messages, "tools": [TOOL]}, "s8"))
    reply = r["choices"][0]["message"]
    tool = {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "18272727"}
    body = {"messages": [*messages, reply, tool], "tools": [TOOL]} | final
    r2 = asyncio.run(door.chat({k: v for k, v in body.items() if v is not None}, "s8"))
    assert r2["choices"][0]["message"] == {"role": "assistant", "content": CALL}
    assert r2["choices"][0]["finish_reason"] == "stop"
    renderer = ChatRenderer(tok, (tok.eos_token_id,))
    glue = renderer.env_ids([Message("user", "48213*379")], [Message("tool", "18272727")], (TOOL,), tok.eos_token_id)
    assert engine.calls[1].input_ids == engine.calls[0].input_ids + _ids(tok, CALL) + glue
    traj = door.store.end("s8", None).trajectory()
    assert exactness(traj, engine.calls)["mismatches"] == 0 and traj.turns[1].tool_calls == ()


@pytest.mark.parametrize("name", ["qwen", "llama", "tiny"])
def test_token_bytes_are_the_tokens_raw_bytes(name, tmp_path) -> None:
    t = {"qwen": qwen_tokenizer, "llama": llama_tokenizer, "tiny": lambda: tiny_tokenizer(tmp_path)}[name]()
    ids = tuple(t.encode(ANSWER, add_special_tokens=False))
    token_bytes = TokenBytes(t)
    raw = [token_bytes(i) for i in ids]
    assert b"".join(raw).decode("utf-8") == t.decode(list(ids))
    if name != "tiny":  # byte-level BPE: some tokens hold part of a character
        assert any(len(b) == 1 and b[0] >= 0x80 for b in raw)
    pieces = text_pieces(t, ids)
    assert "".join(pieces) == t.decode(list(ids)) and "\ufffd" not in "".join(pieces)
    eos = t.eos_token_id
    assert token_bytes(eos) == t.convert_ids_to_tokens(eos).encode()  # a special token: its text


def test_the_engine_server_streams(load_tiny) -> None:
    """``asyncrl serve engine``'s door streams over its own HTTP stack: ``text/event-stream``, the chunks, the usage
    chunk and ``[DONE]``; a streamed session call is recorded like a plain one."""
    import urllib.request

    from asyncrl.rollout.engine import LocalEngine
    from asyncrl.rollout.server import ServerThread

    model, t = load_tiny()
    engine = LocalEngine(model, t, max_slots=4, max_seq_len=256)
    ask = {
        "messages": [{"role": "user", "content": "1+2"}],
        "max_tokens": 6,
        "seed": 2,
        "logprobs": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    try:
        with ServerThread(engine, api_key="k", eos_ids=(t.eos_token_id,), model_path="tiny") as srv:
            req = urllib.request.Request(
                f"{srv.url}/sessions/st-1/v1/chat/completions",
                json.dumps(ask).encode(),
                {"Authorization": "Bearer k", "Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=60) as r:
                kind, raw = r.headers["Content-Type"], r.read().decode()
            record = json.loads(
                urllib.request.urlopen(
                    urllib.request.Request(f"{srv.url}/sessions/st-1", headers={"Authorization": "Bearer k"}),
                    timeout=60,
                ).read()
            )
    finally:
        engine.close()
    assert kind.startswith("text/event-stream")
    events = [e.removeprefix("data: ") for e in raw.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and all(c["usage"] is None for c in chunks[:-1])
    entries = [e for c in chunks[:-1] for e in (c["choices"][0]["logprobs"] or {}).get("content", [])]
    assert usage["completion_tokens"] == len(record["response_ids"]) and usage["prompt_tokens"] == len(
        record["prompt_ids"]
    )
    assert [e["logprob"] for e in entries] == record["behav_logprobs"][: len(entries)]
    assert len(entries) in (len(record["response_ids"]), len(record["response_ids"]) - 1)  # the end token not shown
