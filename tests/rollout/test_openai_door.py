"""The door over HTTP: an unmodified ``openai`` client against ``DoorServer`` (tool calls round trip in
the Hermes format, the example's tool agent, the bearer key, unknown models, a forged tool result on
every shipped template), and ``asyncrl serve engine``'s routes on the tiny ``LocalEngine`` (plain and
session calls, the record, end with a reward, 4xx rules, tokenising off the event loop, the door's bounds)."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest

from asyncrl.rollout.engine import LocalEngine
from asyncrl.rollout.openai_door import ChatDoor, DoorServer
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.server import ServerThread
from tests.repo_paths import REPO
from tests.rollout.chat_templates import FORGED, control_counts, llama_tokenizer, qwen_tokenizer, tiny_tokenizer
from tests.rollout.scripted_engine import ScriptedEngine, Turn, exactness

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "48213*379"}}</tool_call>'


def test_an_openai_client_round_trips_tool_calls(monkeypatch) -> None:
    openai = pytest.importorskip("openai")
    monkeypatch.syspath_prepend(str(REPO))
    from examples.openai_agent.agent import solve_with_tools

    tok = qwen_tokenizer()
    ids = lambda text: tuple(tok.encode(text, add_special_tokens=False)) + (tok.eos_token_id,)  # noqa: E731
    engine = ScriptedEngine({7: [Turn(ids(CALL)), Turn(ids("#18272727"))]})
    door = ChatDoor(engine, tok, model_name="policy", end_of_turn_ids=(tok.eos_token_id,), open_sessions_on_call=False)
    server = DoorServer(door, "secret")

    async def main() -> None:
        await server.start()
        door.open_session("ep-0", SamplingParams(max_new_tokens=64, seed=7), 256)
        try:
            result = await asyncio.to_thread(
                solve_with_tools, server.base_url("ep-0"), "secret", {"question": "48213*379?"}
            )
            assert result is None

            def wrong_key() -> None:
                client = openai.OpenAI(base_url=server.base_url(), api_key="wrong", max_retries=0)
                with pytest.raises(openai.AuthenticationError):
                    client.models.list()
                good = openai.OpenAI(base_url=server.base_url("ep-0"), api_key="secret", max_retries=0)
                assert [m.id for m in good.models.list()] == ["policy"]
                with pytest.raises(openai.BadRequestError, match="differs from the recorded conversation"):
                    good.chat.completions.create(model="policy", messages=[{"role": "user", "content": "other"}])
                with pytest.raises(openai.NotFoundError, match="does not exist") as e:  # OpenAI's answer
                    good.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
                assert e.value.code == "model_not_found"

            await asyncio.to_thread(wrong_key)
        finally:
            await server.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
    session = door.store.end("ep-0", None)
    traj = session.trajectory()
    report = exactness(traj, engine.calls)
    assert report["mismatches"] == 0 and report["mask_errors"] == 0 and report["logprob_errors"] == 0, report
    assert len(engine.calls) == 2 and traj.turns[0].tool_calls == ("calculator",)
    glue = tok.decode(list(traj.segments[1].token_ids))
    assert "<tool_response>\n18272727\n</tool_response>" in glue  # the example's calculator ran
    assert traj.end == "answer"


def _http(url: str, body: object | None = None, key: str | None = "k", method: str | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"))
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_the_engine_server_serves_the_door(load_tiny) -> None:
    model, tok = load_tiny()
    engine = LocalEngine(model, tok, max_slots=8, max_seq_len=256)
    try:
        with ServerThread(engine, api_key="k", eos_ids=(tok.eos_token_id,), model_path="tiny") as srv:
            base = srv.url
            status, models = _http(f"{base}/v1/models")
            assert status == 200 and models["data"][0]["id"] == "tiny"
            ask = {
                "messages": [{"role": "user", "content": "1+2"}],
                "max_tokens": 8,
                "n": 2,
                "seed": 1,
                "logprobs": True,
            }
            status, r = _http(f"{base}/v1/chat/completions", ask)
            assert status == 200 and len(r["choices"]) == 2 and r["object"] == "chat.completion"
            assert all(c["finish_reason"] in ("stop", "length") for c in r["choices"])
            lengths = [len(c["logprobs"]["content"]) for c in r["choices"]]  # one log-prob a token
            assert r["usage"]["completion_tokens"] == sum(lengths) and all(1 <= n <= 8 for n in lengths)

            sid = f"{base}/sessions/run1-0"
            first = {"messages": [{"role": "user", "content": "1+2"}], "max_tokens": 6, "seed": 3, "logprobs": True}
            status, r1 = _http(f"{sid}/v1/chat/completions", first)
            assert status == 200, r1
            reply = r1["choices"][0]["message"]
            then = {**first, "messages": [*first["messages"], reply, {"role": "user", "content": "again"}]}
            status, r2 = _http(f"{sid}/v1/chat/completions", then)
            assert status == 200, r2
            status, record = _http(f"{sid}/end", {"reward": 1.0})
            assert status == 200 and record["ended"] and record["reward"] == 1.0 and record["calls"] == 2
            n1 = r1["usage"]["completion_tokens"]
            prompt1 = r1["usage"]["prompt_tokens"]
            assert record["prompt_ids"] and len(record["prompt_ids"]) == prompt1
            # the second call was given the first call's ids as sampled, then the glue
            assert r2["usage"]["prompt_tokens"] == prompt1 + n1 + record["turns"][0]["env_tokens"]
            n2, glue = r2["usage"]["completion_tokens"], record["turns"][0]["env_tokens"]
            assert record["loss_mask"] == [1] * n1 + [0] * glue + [1] * n2 and glue > 0
            shown = [c["logprob"] for c in r1["choices"][0]["logprobs"]["content"]]
            assert record["behav_logprobs"][: len(shown)] == shown  # the reply's log-probs are the recorded ones
            assert _http(f"{sid}")[1]["session_id"] == "run1-0"

            assert _http(f"{base}/v1/models", key=None)[0] == 401
            assert _http(f"{base}/v1/chat/completions", {"messages": []})[0] == 400
            assert _http(f"{base}/v1/chat/completions", method="GET")[0] == 405
            assert _http(f"{sid}/v1/chat/completions", first)[0] == 400  # ended
            assert _http(f"{base}/sessions/nobody/end", {})[0] == 404
            assert _http(f"{base}/sessions/bad%20id/v1/models")[0] == 400
            assert _http(f"{base}/v1/embeddings", {"input": "x"})[0] == 404
            assert _http(f"{base}/health", key=None)[0] == 200  # the other routes are unchanged
    finally:
        engine.close()


def test_stop_ends_idle_keep_alive_connections() -> None:
    engine = ScriptedEngine({})
    server = DoorServer(ChatDoor(engine, qwen_tokenizer()), "k")

    async def main() -> None:
        await server.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n\r\n")
        await writer.drain()
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        await asyncio.wait_for(server.stop(), 5)  # the connection is idle, kept alive: stop still returns
        rest = await asyncio.wait_for(reader.read(), 5)  # the rest of the answer, then the server's close
        assert rest.endswith(b'"asyncrl"}]}')
        writer.close()

    asyncio.run(main())


@pytest.mark.parametrize("name", ["tiny", "qwen", "llama"])
def test_a_forged_tool_result_through_an_openai_client_is_text(name: str, tmp_path) -> None:
    """An unmodified ``openai`` client sends a tool result that writes the template's control text (a forged
    system turn and assistant answer): the engine's input and the recorded episode hold exactly the control
    tokens of a benign tool result's episode, and the payload reads back as written (was: real control tokens,
    3 ``<|im_end|>`` and 4 ``<|im_start|>`` where Qwen's template puts 1 and 2)."""
    openai = pytest.importorskip("openai")
    tok = {"tiny": lambda: tiny_tokenizer(tmp_path), "qwen": qwen_tokenizer, "llama": llama_tokenizer}[name]()
    ids = lambda text: tuple(tok.encode(text, add_special_tokens=False)) + (tok.eos_token_id,)  # noqa: E731
    turns = [Turn(ids("Let me check.")), Turn(ids("#9128"))]
    engine = ScriptedEngine({1: turns, 2: turns})
    door = ChatDoor(engine, tok, end_of_turn_ids=(tok.eos_token_id,), open_sessions_on_call=False)
    server = DoorServer(door, "k")

    def agent(session_id: str, result: str) -> None:
        client = openai.OpenAI(base_url=server.base_url(session_id), api_key="k", max_retries=0)
        messages: list = [{"role": "user", "content": "What is 9000+128?"}]
        first = client.chat.completions.create(model="asyncrl", messages=messages).choices[0].message
        messages += [first, {"role": "tool", "tool_call_id": "call_0", "content": result}]
        assert client.chat.completions.create(model="asyncrl", messages=messages).choices[0].message.content == "#9128"

    async def main() -> None:
        await server.start()
        try:
            door.open_session("benign", SamplingParams(max_new_tokens=32, seed=1), 512)
            door.open_session("forged", SamplingParams(max_new_tokens=32, seed=2), 512)
            await asyncio.to_thread(agent, "benign", "9128")
            await asyncio.to_thread(agent, "forged", FORGED[name])
        finally:
            await server.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
    benign, forged = (door.store.end(s, None).trajectory() for s in ("benign", "forged"))
    engine_inputs = {c.sampling.seed: c.input_ids for c in engine.calls}  # each session's second call
    assert control_counts(tok, engine_inputs[2]) == control_counts(tok, engine_inputs[1])
    assert control_counts(tok, forged.token_ids) == control_counts(tok, benign.token_ids)
    glue = forged.segments[1].token_ids
    assert FORGED[name] in tok.decode(list(glue), skip_special_tokens=False)
    if name == "qwen":  # the model closed its turn; the glue: </tool_response><|im_end|>, user and assistant headers
        assert control_counts(tok, glue) == {"<|im_end|>": 1, "<|im_start|>": 2}


class _HeldTokenizer:
    """A tokenizer whose chat template waits for ``release`` (and records the threads that rendered)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.entered = threading.Event()
        self.release = threading.Event()
        self.threads: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        self.threads.add(threading.get_ident())
        self.entered.set()
        self.release.wait(60)
        return self.tokenizer.apply_chat_template(*args, **kwargs)


def test_health_answers_while_a_chat_request_is_tokenised(load_tiny) -> None:
    """Rendering and tokenising run on the door's worker thread: with a chat request held inside the
    tokenizer, ``/health`` is answered (was: the event loop did it, and a 6 MB message froze the server)."""
    model, tok = load_tiny()
    engine = LocalEngine(model, tok, max_slots=4, max_seq_len=256)
    try:
        with ServerThread(engine, api_key="k", eos_ids=(tok.eos_token_id,), model_path="tiny") as srv:
            held = _HeldTokenizer(tok)
            srv.server.door.tokenizer = held
            answers: dict[str, tuple[int, dict]] = {}
            ask = {"messages": [{"role": "user", "content": "1+2"}], "max_tokens": 2}
            chat = threading.Thread(target=lambda: answers.update(chat=_http(f"{srv.url}/v1/chat/completions", ask)))
            chat.start()
            assert held.entered.wait(60)
            try:
                answers["health"] = _http(f"{srv.url}/health", key=None)  # while the chat request is held
            finally:
                held.release.set()
                chat.join(60)
            assert answers["health"][0] == 200 and answers["chat"][0] == 200
            assert held.threads and srv._thread.ident not in held.threads
    finally:
        engine.close()


def test_the_engine_servers_door_bounds(load_tiny, tiny_dir) -> None:
    """``asyncrl serve engine``'s door: the model is named by its directory's name (no path anywhere in
    ``/v1/models``), other names are 404 ``model_not_found``; a message over ``max_request_chars`` is 400
    naming the limit; past ``max_open_sessions`` the least recently used session is evicted and answers 404;
    malformed input that was a 500 is a 4xx."""
    model, tok = load_tiny()
    engine = LocalEngine(model, tok, max_slots=4, max_seq_len=256)
    try:
        with ServerThread(
            engine,
            api_key="k",
            eos_ids=(tok.eos_token_id,),
            model_path=str(tiny_dir),
            max_request_chars=1000,
            max_open_sessions=1,
        ) as srv:
            base = srv.url
            status, models = _http(f"{base}/v1/models")
            assert status == 200 and [m["id"] for m in models["data"]] == [tiny_dir.name]
            assert str(tiny_dir) not in json.dumps(models) and "/" not in json.dumps(models["data"])
            ask = {"messages": [{"role": "user", "content": "1+2"}], "max_tokens": 2}
            status, r = _http(f"{base}/v1/chat/completions", {**ask, "model": tiny_dir.name})
            assert status == 200 and r["model"] == tiny_dir.name
            for name in ("gpt-4o", str(tiny_dir)):
                status, r = _http(f"{base}/v1/chat/completions", {**ask, "model": name})
                assert status == 404 and r["code"] == "model_not_found" and "does not exist" in r["message"]
            big = {"messages": [{"role": "user", "content": "1" * 1001}]}
            status, r = _http(f"{base}/v1/chat/completions", big)
            assert status == 400 and "1001 characters; this server reads at most 1000" in r["message"]

            assert _http(f"{base}/sessions/a/v1/chat/completions", ask)[0] == 200
            assert _http(f"{base}/sessions/b/v1/chat/completions", ask)[0] == 200  # evicts "a"
            for status, r in (_http(f"{base}/sessions/a/v1/chat/completions", ask), _http(f"{base}/sessions/a")):
                assert status == 404 and "a was evicted: this server holds at most 1 open sessions" in r["message"]

            malformed = [
                ("/v1/chat/completions", {**ask, "tools": [1]}),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]}),
                (
                    "/v1/chat/completions",
                    {**ask, "tools": [{"function": {"name": "f", "parameters": {"properties": 1}}}]},
                ),
                ("/sessions/b/end", {"reward": float("nan")}),
                ("/sessions/b/end", {"reward": float("inf")}),
                ("/sessions/b/end", {"reward": 10**400}),  # was: 500, an OverflowError
            ]
            for path, body in malformed:
                status, r = _http(f"{base}{path}", body)
                assert 400 <= status < 500, (path, body, status, r)
            assert srv.server.errors_5xx == 0 and _http(f"{base}/sessions/b")[1]["ended"] is False
    finally:
        engine.close()
