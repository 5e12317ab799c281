"""Engine server + RemoteEngine: protocol, parity with LocalEngine, robustness, pause/update, load."""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest
import torch

from asyncrl.models import stop_token_ids
from asyncrl.rollout.engine import LocalEngine
from asyncrl.rollout.interruptible import generate_group
from asyncrl.rollout.remote import RemoteEngine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.server import ServerThread
from asyncrl.types import WeightUpdate


@pytest.fixture
def served(load_tiny, tiny_dir, tmp_path):
    model, tok = load_tiny()
    eng = LocalEngine(model, tok, max_slots=64, max_seq_len=128)
    srv = ServerThread(eng, model_path=str(tiny_dir), eos_ids=stop_token_ids(tok, model), weights_root=tmp_path)
    yield eng, srv
    srv.stop()
    eng.close()


async def raw_http(port: int, data: bytes) -> tuple[int, dict]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split()[1])
    length = int([h for h in head.decode().split("\r\n") if h.lower().startswith("content-length")][0].split(":")[1])
    body = json.loads(await reader.readexactly(length))
    writer.close()
    return status, body


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def test_binds_to_loopback_by_default(served):
    _, srv = served
    assert srv.host == "127.0.0.1" and srv.server.port > 0


def test_remote_matches_local_and_reports_versions(served, arun):
    eng, srv = served
    remote = RemoteEngine(srv.url)
    p = eng.tokenizer("Q:4+4=?\nA:")["input_ids"]
    sp = SamplingParams(max_new_tokens=20, temperature=0.8, top_p=0.9, seed=5)

    async def go():
        r = await remote.generate(p, sp, n=3)
        loc = await eng.generate(p, sp, n=3)
        g = await generate_group(remote, p, SamplingParams(max_new_tokens=7, greedy=True), 2)
        info = await remote.model_info()
        return r, loc, g, info

    r, loc, g, info = arun(go())
    remote.close()
    assert [c.output_ids for c in r] == [c.output_ids for c in loc]  # same seeds -> same samples
    for a, b in zip(r, loc, strict=True):
        assert max(abs(x - y) for x, y in zip(a.behav_logprobs, b.behav_logprobs, strict=True)) < 1e-6
        assert a.versions == (0,) * 20 and a.finish_reason == "length" and a.prompt_ids == tuple(p)
    assert [len(c.output_ids) for c in g] == [7, 7]
    assert info["weight_version"] == "0" and info["max_slots"] == 64


def test_sglang_response_shape(served, arun):
    eng, srv = served

    async def go():
        body = {
            "input_ids": [5, 6, 7],
            "sampling_params": {"max_new_tokens": 4, "temperature": 0},
            "return_logprob": True,
        }
        single = await raw_http(srv.server.port, post("/generate", json.dumps(body).encode()))
        body["input_ids"] = [[5, 6, 7], [8, 9]]
        batch = await raw_http(srv.server.port, post("/generate", json.dumps(body).encode()))
        return single, batch

    (s1, one), (s2, many) = arun(go())
    assert s1 == 200 and isinstance(one, dict) and s2 == 200 and len(many) == 2
    meta = one["meta_info"]
    assert len(one["output_ids"]) == meta["completion_tokens"] <= 4
    assert meta["finish_reason"]["type"] in ("stop", "length") and meta["prompt_tokens"] == 3
    assert [t for _, t, _ in meta["output_token_logprobs"]] == one["output_ids"]
    assert meta["output_token_versions"] == [0] * len(one["output_ids"]) and meta["weight_version"] == "0"


MALFORMED = [
    (post("/generate", b"{not json"), 400),
    (post("/generate", b"[1, 2]"), 400),
    (post("/generate", json.dumps({"input_ids": "hello"}).encode()), 400),
    (post("/generate", json.dumps({"input_ids": [1, "2"]}).encode()), 400),
    (post("/generate", json.dumps({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": "8"}}).encode()), 400),
    (post("/generate", json.dumps({"input_ids": [1, 2], "sampling_params": {"top_p": 2}}).encode()), 400),
    (post("/generate", json.dumps({"input_ids": [1, 2], "sampling_params": {"n": 1000}}).encode()), 400),
    (post("/generate", json.dumps({"input_ids": [1, 2], "sampling_params": {"beam_width": 3}}).encode()), 400),
    (
        post("/generate", json.dumps({"input_ids": [1, 2], "sampling_params": {"repetition_penalty": 1.2}}).encode()),
        400,
    ),
    (post("/generate", json.dumps({"input_ids": [1, 2], "return_logprob": "yes"}).encode()), 400),
    (post("/generate", json.dumps({"input_ids": [99999]}).encode()), 400),
    (post("/generate", json.dumps({"input_ids": [1] * 500}).encode()), 400),  # over-long input
    (post("/generate", json.dumps({"input_ids": []}).encode()), 400),
    (post("/generate", json.dumps({"input_ids": [1], "stream": True}).encode()), 400),
    (post("/pause_generation", json.dumps({"mode": "retract"}).encode()), 400),
    (post("/update_weights_from_disk", json.dumps({"model_path": 3}).encode()), 400),
    (post("/update_weights_from_disk", json.dumps({"model_path": "/nonexistent"}).encode()), 403),  # outside the root
    (post("/update_weights_from_disk", json.dumps({"model_path": "nonexistent"}).encode()), 400),
    (post("/nope", b"{}"), 404),
    (b"GET /generate HTTP/1.1\r\nHost: x\r\n\r\n", 405),
    (b"this is not http\r\n\r\n", 400),
    # chunked and Content-Length at once: which one frames the body is ambiguous (request smuggling)
    (post("/generate", b"{}", extra="Transfer-Encoding: chunked\r\n"), 400),
    (b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n", 413),
    (b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400),
    # the 160 KB body that queued 80,000 samples: batch x n is capped (max_samples_per_request)
    (post("/generate", json.dumps({"input_ids": [[5]] * 10000, "sampling_params": {"n": 8}}).encode()), 400),
    (post("/generate", json.dumps({"text": ["1+2"] * 1025}).encode()), 400),
    (post("/generate", b'{"input_ids": [1, 2], "sampling_params": {"temperature": NaN}}'), 400),
    (post("/generate", b'{"input_ids": [1, 2], "sampling_params": {"temperature": Infinity}}'), 400),
    (post("/generate", b"[" * 100_000), 400),  # nested past the parser's depth (was: 500, RecursionError)
    (post("/update_weights_from_disk", json.dumps({"model_path": "x", "weight_version": -5}).encode()), 409),
]


@pytest.mark.parametrize("data,status", MALFORMED)
def test_malformed_requests_get_4xx_and_server_survives(served, arun, data, status):
    eng, srv = served

    async def go():
        got, body = await raw_http(srv.server.port, data)
        health, _ = await raw_http(srv.server.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        remote = RemoteEngine(srv.url)
        (c,) = await remote.generate([5, 6], SamplingParams(max_new_tokens=3))
        remote.close()
        return got, body, health, c

    got, body, health, c = arun(go())
    assert got == status and body["code"] == status and body["message"]
    assert health == 200 and len(c.output_ids) == 3
    assert srv.server.errors_5xx == 0


def test_a_chunked_body_is_read(served, arun):
    """A body in chunks (no ``Content-Length``) is served like any other; past the limit it gets 413."""
    eng, srv = served
    body = json.dumps({"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2}}).encode()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + 8]), body[i : i + 8]) for i in range(0, len(body), 8))
    head = b"POST /generate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    big = b"%x\r\n%s\r\n" % (5 << 20, b"1" * (5 << 20))  # two chunks of 5 MiB: over the 8 MiB limit

    async def go():
        return (
            await raw_http(srv.server.port, head + chunks + b"0\r\n\r\n"),
            await raw_http(srv.server.port, head + big + big + b"0\r\n\r\n"),
        )

    (status, answer), (too_big, refusal) = arun(go())
    assert status == 200 and len(answer["output_ids"]) == 2
    assert too_big == 413 and "exceeds the limit of 8388608 bytes" in refusal["message"]
    assert srv.server.errors_5xx == 0


def test_over_long_input_raises_value_error_in_client(served, arun):
    _, srv = served
    remote = RemoteEngine(srv.url)
    with pytest.raises(ValueError, match="too long"):
        arun(remote.generate([1] * 300, SamplingParams(max_new_tokens=3)))
    remote.close()


def test_pause_abort_and_update_from_disk(served, arun, tmp_path):
    from safetensors.torch import save_file

    eng, srv = served
    save_file({k: v.clone() for k, v in eng.model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    remote = RemoteEngine(srv.url)
    p = [5, 6, 7]

    async def go():
        task = asyncio.create_task(remote.generate(p, SamplingParams(max_new_tokens=100, seed=1), n=2))
        while eng.stats()["decode_steps"] < 5:
            await asyncio.sleep(0.005)
        aborted = await remote.abort_all()
        partial = await task
        await remote.pause()
        paused_task = asyncio.create_task(remote.generate(p, SamplingParams(max_new_tokens=5)))
        await asyncio.sleep(0.2)
        assert not paused_task.done()
        await remote.update_weights(WeightUpdate(7, path=str(tmp_path)))
        await remote.resume()
        after = await paused_task
        return aborted, partial, after

    aborted, partial, after = arun(go())
    remote.close()
    assert aborted == 2 and all(c.finish_reason == "abort" and 0 < len(c.output_ids) < 100 for c in partial)
    assert eng.version == 7 and remote.version == 7 and after[0].versions == (7,) * 5


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"input_ids": [[5]] * 10000, "sampling_params": {"n": 8}},
            "asks for 80000 samples (10000 prompts x n=8); this server takes at most 1024 per request",
        ),
        ({"text": ["1+2"] * 300, "sampling_params": {"n": 4}}, "asks for 1200 samples (300 prompts x n=4)"),
        ({"text": "1" * 1_000_001}, "'text' holds 1000001 characters; this server reads at most 1000000"),
        ({"input_ids": [1, 2], "sampling_params": {"temperature": float("nan")}}, "must be a finite number"),
        ({"input_ids": [1, 2], "sampling_params": {"temperature": 10**400}}, "must be a finite number"),
        ({"text": ["1+2", ""]}, "a prompt encodes to no tokens"),
    ],
    ids=["80000-samples", "text-batch", "text-chars", "nan", "huge-int", "empty-text"],
)
def test_generate_caps_and_checks_name_themselves(served, arun, body, message):
    """The caps on one ``/generate`` (samples, characters of text) answer 400 before anything is queued or
    tokenised, naming the cap; a non-finite number is refused (was: queued, tokenised, accepted)."""
    eng, srv = served
    status, answer = arun(raw_http(srv.server.port, post("/generate", json.dumps(body).encode())))
    assert status == 400 and message in answer["message"], answer
    assert eng.stats()["generated_tokens"] == 0


def test_weight_versions_only_move_forward_and_garbage_weights_are_400(served, arun, tmp_path):
    """A weight update below the engine's version is 409 (an equal one, a retry, is applied); a file that is
    not safetensors, or a sharded index naming a file outside its directory, is 400 and the engine keeps
    its weights and version and goes on serving (was: the version went to -5; 500 for the garbage file)."""
    from safetensors.torch import save_file

    eng, srv = served
    state = {k: v.clone() for k, v in eng.model.state_dict().items()}
    (tmp_path / "good").mkdir()
    save_file(state, str(tmp_path / "good" / "model.safetensors"))
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (tmp_path / "escape").mkdir()
    index = {"weight_map": {"lm_head.weight": "../good/model.safetensors"}}
    (tmp_path / "escape" / "model.safetensors.index.json").write_text(json.dumps(index))
    first = next(iter(state))

    def update(path: str, version: object) -> tuple[int, dict]:
        body = json.dumps({"model_path": path, "weight_version": version}).encode()
        return arun(raw_http(srv.server.port, post("/update_weights_from_disk", body)))

    status, answer = update("good", 1.5)
    assert status == 400 and "'weight_version' must be an integer (or its string), got 1.5" in answer["message"]
    assert update("good", 3)[0] == 200 and eng.version == 3
    for version in (-5, 2):
        status, answer = update("good", version)
        assert status == 409 and f"weight_version {version} is below this engine's version 3" in answer["message"]
    assert update("good", "3")[0] == 200 and eng.version == 3
    with torch.no_grad():
        eng.model.state_dict()[first].add_(1.0)  # tell the weights apart from the file's
    before = eng.model.state_dict()[first].clone()
    for path, reason in (("garbage", "is not a readable safetensors file"), ("escape", "not a file of its own")):
        status, answer = update(path, 4)
        assert status == 400 and reason in answer["message"] and "the engine keeps its weights" in answer["message"]
        assert eng.version == 3 and torch.equal(eng.model.state_dict()[first], before)
    remote = RemoteEngine(srv.url)
    (c,) = arun(remote.generate([5, 6], SamplingParams(max_new_tokens=3)))
    remote.close()
    assert c.versions == (3, 3, 3) and srv.server.errors_5xx == 0


@pytest.mark.slow
def test_thousand_concurrent_requests_none_lost(served, arun):
    eng, srv = served
    remote = RemoteEngine(srv.url, max_connections=1000)
    rng = random.Random(0)
    jobs = [([rng.randint(4, 90) for _ in range(rng.randint(3, 20))], rng.randint(1, 12)) for _ in range(1000)]

    async def go():
        t0 = time.perf_counter()
        outs = await asyncio.gather(
            *(remote.generate(p, SamplingParams(max_new_tokens=k, seed=i)) for i, (p, k) in enumerate(jobs))
        )
        return outs, time.perf_counter() - t0

    outs, wall = arun(go())
    remote.close()
    assert len(outs) == 1000
    for (p, k), (c,) in zip(jobs, outs, strict=True):
        assert c.prompt_ids == tuple(p) and len(c.output_ids) == k and c.finish_reason == "length"
        assert torch.isfinite(torch.tensor(c.behav_logprobs)).all()
    assert srv.server.errors_4xx == 0 and srv.server.errors_5xx == 0
    assert eng.stats()["requests"] >= 1000
    print(f"1000 concurrent /generate: {wall:.1f} s")
