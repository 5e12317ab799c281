"""Contract tests of ``rollout.sglang_engine.SGLangEngine`` (``rollout.backend=sglang``) against a fake SGLang server.

SGLang is GPU-only and not installable here, so ``tests/rollout/sglang_fake.py`` stands in: its handlers take and
answer exactly the shapes of SGLang's source (sglang 0.5.23) and refuse any other field. Checked here:
- the request bodies the client sends (every key, the pause modes, the update's ``flush_cache``), and that the fake
  does refuse a wrong shape (so these tests can fail);
- token ids and log-probs passed through as the server sampled them, each log-prob equal to the fake model's under
  the version the token is stamped with: across an in-flight update in ``abort`` mode (aborted, resubmitted by
  ``generate_group``) and ``keep`` mode (one request spans both versions, from SGLang's ``weight_versions``);
- refusals: greedy at T != 1, in-process tensors, a bad update (before any pause), keep mode without spans;
- ``build_engine`` with ``rollout.backend=sglang``: the starting weights loaded, versions across an update;
  a short ``train`` whose ledger passes; the config's refusals.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch
from aiohttp import web

from asyncrl.config import ConfigError, load_config
from asyncrl.controller.ledger_checks import check_ledger
from asyncrl.launch.local import train
from asyncrl.launch.stages import build_engine
from asyncrl.models import load_policy
from asyncrl.rollout.api import RolloutEngine
from asyncrl.rollout.interruptible import generate_group
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.sglang_engine import SGLangEngine
from asyncrl.trainer.weights import save_safetensors_dir
from asyncrl.types import Completion, WeightUpdate
from tests.protocol_check import protocol_problems
from tests.rollout.sglang_fake import FakeSGLang, toy_logprobs

VOCAB = 16
PROMPT = [1, 5, 7]
STOP = 15


def with_fake(body: Callable[[FakeSGLang, str], Awaitable[Any]], **fake_kw: Any) -> Any:
    """Run ``body(server, url)`` in a fresh event loop with a fake SGLang server listening on a free port."""

    async def main() -> Any:
        server = FakeSGLang(VOCAB, **fake_kw)
        runner = web.AppRunner(server.app())
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            return await body(server, f"http://127.0.0.1:{runner.addresses[0][1]}")
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def export(tmp_path: Path, name: str, scale: float = 1.0) -> str:
    """A safetensors export (the trainer's layout) of a two-tensor "model"."""
    state = {"model.embed_tokens.weight": torch.full((VOCAB, 4), scale), "lm_head.weight": torch.ones(VOCAB, 4)}
    out, _ = save_safetensors_dir(state, tmp_path / name)
    return str(out)


def check_against_toy(c: Completion, temperature: float) -> int:
    """Each log-prob equals the fake model's under the version the token is stamped with; returns tokens checked."""
    seq = list(c.prompt_ids) + list(c.output_ids)
    for k, (tok, lp, v) in enumerate(zip(c.output_ids, c.behav_logprobs, c.versions, strict=True)):
        want = toy_logprobs(seq[len(c.prompt_ids) + k - 1], str(v), VOCAB, temperature)[tok]
        assert lp == pytest.approx(want, abs=1e-9), (k, v)
    return len(c.output_ids)


async def wait_for(cond: Callable[[], bool]) -> None:
    for _ in range(2000):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition never held")


def test_protocol_and_request_shapes(tmp_path: Path) -> None:
    async def body(server: FakeSGLang, url: str) -> None:
        assert protocol_problems(SGLangEngine, RolloutEngine) == []
        engine = SGLangEngine(url, vocab_size=VOCAB, max_seq_len=64, initial_weights=export(tmp_path, "v0"))
        sampling = SamplingParams(max_new_tokens=6, temperature=0.7, top_p=0.9, stop_token_ids=(STOP,), seed=11)
        done: list[int] = []
        out = await engine.generate(PROMPT, sampling, n=3, on_sample_done=done.append)
        assert sorted(done) == [0, 1, 2] and len(out) == 3
        paths = [p for p, _ in server.calls]
        assert paths[:2] == ["/model_info", "/update_weights_from_disk"] and paths[2:] == ["/generate"] * 3
        assert server.calls[1][1] == {"model_path": str(tmp_path / "v0"), "weight_version": "0", "flush_cache": True}
        bodies = [b for p, b in server.calls if p == "/generate"]
        seeds = sorted(b["sampling_params"]["sampling_seed"] for b in bodies)
        assert seeds == [11, 12, 13]
        for body in bodies:
            assert set(body) == {
                "rid",
                "input_ids",
                "sampling_params",
                "return_logprob",
                "logprob_start_len",
                "extra_key",
            }
            assert body["input_ids"] == PROMPT and body["return_logprob"] is True and body["logprob_start_len"] == -1
            assert body["extra_key"] == "asyncrl-weights-v0"
            params = dict(body["sampling_params"])
            params.pop("sampling_seed")
            assert params == {
                "max_new_tokens": 6,
                "temperature": 0.7,
                "top_p": 0.9,
                "top_k": -1,
                "stop_token_ids": [STOP],
                "ignore_eos": True,
            }
        for c in out:
            assert c.finish_reason in ("stop", "length") and c.versions == (0,) * len(c.output_ids)
            assert check_against_toy(c, 0.7) > 0
        assert engine.stats()["generated_tokens"] == sum(len(c.output_ids) for c in out)
        engine.close()

    with_fake(body)


def test_the_fake_refuses_what_sglang_would_not_take() -> None:
    async def body(server: FakeSGLang, url: str) -> None:
        good = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}, "return_logprob": True}
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{url}/generate", json=good) as r:
                assert r.status == 200
            for bad in (
                {**good, "prompt_token_ids": PROMPT},
                {**good, "sampling_params": {"max_tokens": 1}},
                {**good, "return_logprob": 1},
            ):
                async with http.post(f"{url}/generate", json=bad) as r:
                    assert r.status == 400, bad
            async with http.post(f"{url}/pause_generation", json={"mode": "keep"}) as r:
                assert r.status == 400
            async with http.post(f"{url}/update_weights_from_disk", json={"path": "/x"}) as r:
                assert r.status == 400

    with_fake(body)


async def run_update_in_flight(
    server: FakeSGLang, engine: SGLangEngine, update: Callable[[], Awaitable[None]], temperature: float = 1.0
) -> list[Completion]:
    """A group of 2 long samples; ``update`` once each has a few tokens."""
    sampling = SamplingParams(max_new_tokens=40, temperature=temperature, seed=3)
    task = asyncio.ensure_future(generate_group(engine, PROMPT, sampling, 2))
    await wait_for(lambda: len(server.running) == 2 and all(len(r.output) >= 4 for r in server.running.values()))
    await update()
    return await task


def test_abort_mode_update_in_flight(tmp_path: Path) -> None:
    async def body(server: FakeSGLang, url: str) -> None:
        engine = SGLangEngine(url, vocab_size=VOCAB, max_seq_len=64, interrupt_mode="abort")
        v1 = export(tmp_path, "v1", 2.0)
        out = await run_update_in_flight(
            server, engine, lambda: engine.update_weights(WeightUpdate(version=1, path=v1))
        )
        assert engine.version == 1
        control = [(p, b) for p, b in server.calls if p != "/generate"]
        assert control == [
            ("/model_info", None),
            ("/update_weight_version", {"new_version": "0", "abort_all_requests": False}),
            ("/pause_generation", {"mode": "abort"}),
            ("/update_weights_from_disk", {"model_path": v1, "weight_version": "1", "flush_cache": True}),
            ("/continue_generation", {}),
        ]
        for c in out:
            assert c.finish_reason == "length" and len(c.output_ids) == 40 and c.num_interruptions == 1
            k = c.versions.index(1)
            assert 4 <= k < 40 and c.versions == (0,) * k + (1,) * (40 - k)
            assert check_against_toy(c, 1.0) == 40
        resubmitted = [b for p, b in server.calls if p == "/generate"][2:]
        assert len(resubmitted) == 2 and all(b["extra_key"] == "asyncrl-weights-v1" for b in resubmitted)
        assert engine.stats()["aborted_samples"] == 2

    with_fake(body)


def test_keep_mode_update_in_flight(tmp_path: Path) -> None:
    async def body(server: FakeSGLang, url: str) -> None:
        engine = SGLangEngine(url, vocab_size=VOCAB, max_seq_len=64, interrupt_mode="keep")
        v1 = export(tmp_path, "v1", 2.0)
        out = await run_update_in_flight(
            server, engine, lambda: engine.update_weights(WeightUpdate(version=1, path=v1))
        )
        control = [(p, b) for p, b in server.calls if p not in ("/generate", "/model_info", "/update_weight_version")]
        assert control == [
            ("/pause_generation", {"mode": "in_place"}),
            ("/update_weights_from_disk", {"model_path": v1, "weight_version": "1", "flush_cache": False}),
            ("/continue_generation", {}),
        ]
        assert len([p for p, _ in server.calls if p == "/generate"]) == 2  # nothing resubmitted
        for c in out:
            assert c.finish_reason == "length" and c.num_interruptions == 1
            k = c.versions.index(1)
            assert 4 <= k < 40 and c.versions == (0,) * k + (1,) * (40 - k)
            assert check_against_toy(c, 1.0) == 40
        assert engine.stats()["keep_interrupted_samples"] == 2

    with_fake(body)


def test_refusals(tmp_path: Path) -> None:
    async def body(server: FakeSGLang, url: str) -> None:
        engine = SGLangEngine(url, vocab_size=VOCAB, max_seq_len=64, initial_weights=export(tmp_path, "v0"))
        with pytest.raises(ValueError, match="greedy decoding at temperature 0.5"):
            await engine.generate(PROMPT, SamplingParams(max_new_tokens=2, temperature=0.5, greedy=True))
        (c,) = await engine.generate(PROMPT, SamplingParams(max_new_tokens=3, greedy=True))
        assert [b for p, b in server.calls if p == "/generate"][0]["sampling_params"]["temperature"] == 0.0
        assert check_against_toy(c, 0.0) == len(c.output_ids)
        with pytest.raises(ValueError, match="trainer.weight_transport=safetensors"):
            await engine.update_weights(WeightUpdate(version=1, tensors={}))
        bad = save_safetensors_dir({"model.embed_tokens.weight": torch.ones(VOCAB + 1, 4)}, tmp_path / "bad")[0]
        with pytest.raises(ValueError, match="has shape"):
            await engine.update_weights(WeightUpdate(version=1, path=str(bad)))
        assert engine.version == 0 and "/pause_generation" not in [p for p, _ in server.calls]
        with pytest.raises(ValueError, match="input_ids must lie in"):
            await engine.generate([VOCAB], SamplingParams(max_new_tokens=2))

    with_fake(body)


def test_keep_mode_needs_version_spans() -> None:
    async def body(server: FakeSGLang, url: str) -> None:
        server.spans = False
        sampling = SamplingParams(max_new_tokens=3, seed=1)
        keep = SGLangEngine(url, vocab_size=VOCAB, max_seq_len=64, interrupt_mode="keep")
        with pytest.raises(RuntimeError, match="weight_versions"):
            await keep.generate(PROMPT, sampling)
        abort = SGLangEngine(url, vocab_size=VOCAB, max_seq_len=64, interrupt_mode="abort", version=5)
        (c,) = await abort.generate(PROMPT, sampling)
        assert c.versions == (5, 5, 5)  # the response's meta_info.weight_version, set by the client before

    with_fake(body)


def test_pause_resume_and_abort_all() -> None:
    async def body(server: FakeSGLang, url: str) -> None:
        engine = SGLangEngine(url, vocab_size=VOCAB, max_seq_len=64)
        task = asyncio.ensure_future(engine.generate(PROMPT, SamplingParams(max_new_tokens=40, seed=2), n=2))
        await wait_for(lambda: len(server.running) == 2)
        await engine.pause()
        await engine.resume()
        assert await engine.abort_all() == 2
        out = await task
        assert [c.finish_reason for c in out] == ["abort", "abort"]
        control = [(p, b) for p, b in server.calls if p not in ("/generate", "/model_info", "/update_weight_version")]
        assert control == [
            ("/pause_generation", {"mode": "in_place"}),
            ("/continue_generation", {}),
            ("/abort_request", {"abort_all": True}),
        ]

    with_fake(body)


def sglang_config(url: str, tmp_path: Path, *more: str) -> Any:
    return load_config(
        overrides=[
            "rollout.backend=sglang",
            f"rollout.sglang_urls={url}",
            "trainer.weight_transport=safetensors",
            f"trainer.weight_export_dir={tmp_path / 'exports'}",
            *more,
        ]
    )


def test_build_engine_runs_across_an_update(tmp_path: Path, tiny_policy_dir: Path) -> None:
    async def body(server: FakeSGLang, url: str) -> None:
        model, tokenizer = load_policy(tiny_policy_dir)
        server.vocab = int(model.config.vocab_size)
        cfg = sglang_config(url, tmp_path, "rollout.interrupt_mode=abort")
        engine = build_engine(cfg, model, tokenizer)
        assert isinstance(engine, SGLangEngine)
        v1 = tmp_path / "exports" / "v00000001"
        model.save_pretrained(str(v1), safe_serialization=True)  # the trainer's export layout
        sampling = SamplingParams(max_new_tokens=40, seed=9)
        task = asyncio.ensure_future(generate_group(engine, PROMPT, sampling, 2))
        await wait_for(lambda: len(server.running) == 2 and all(len(r.output) >= 4 for r in server.running.values()))
        await engine.update_weights(WeightUpdate(version=1, path=str(v1)))
        out = await task
        initial = server.loaded[0]
        assert Path(initial).parent == tmp_path / "exports" and server.loaded[1:] == [str(v1)]
        assert all(set(c.versions) == {0, 1} and len(c.output_ids) == 40 for c in out)
        engine.close()
        assert not Path(initial).exists()  # the starting weights' copy is the engine's

    with_fake(body)


def test_config_refusals(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs rollout.sglang_urls"):
        load_config(overrides=["rollout.backend=sglang", "trainer.weight_transport=safetensors"])
    with pytest.raises(ConfigError, match="trainer.weight_transport=safetensors"):
        load_config(overrides=["rollout.backend=sglang", "rollout.sglang_urls=http://h:1"])
    with pytest.raises(ConfigError, match="eval.greedy"):
        sglang_config("http://h:1", tmp_path, "rollout.temperature=0.7", "eval.greedy=true")
    with pytest.raises(ConfigError, match="not an http"):
        sglang_config("ftp://h:1", tmp_path)
    assert sglang_config("http://a:1,http://b:2", tmp_path).rollout.sglang_urls == "http://a:1,http://b:2"


def test_a_short_train_run_against_the_fake_server(tmp_path: Path, tiny_policy_dir: Path) -> None:
    """``asyncrl train`` with ``rollout.backend=sglang`` (the local launcher, in-flight updates in ``abort`` mode)
    against the fake server, run in a thread of its own: it trains its steps, the server decodes under the
    starting weights and each exported version, and the ledger passes."""
    model, _ = load_policy(tiny_policy_dir)
    server = FakeSGLang(int(model.config.vocab_size), step_s=0.002)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(server.app())
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    steps, run_dir = 2, tmp_path / "run"
    try:
        cfg = sglang_config(
            url,
            tmp_path,
            f"model.path={tiny_policy_dir}",
            f"run.run_dir={run_dir}",
            "run.progress=false",
            "rollout.group_size=2",
            "rollout.max_new_tokens=12",
            "eval.max_new_tokens=4",
            "task.eval_size=2",
            "controller.batch_size=2",
            f"controller.total_steps={steps}",
            "controller.trainer_process=false",
            "algo.filter_equal_rewards=false",
        )
        _, summary = train(cfg)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
    assert summary["steps"] == steps
    report = check_ledger(run_dir, ended=True, total_steps=steps)
    assert report.ok, report
    assert len(server.loaded) >= 2 and Path(server.loaded[0]).name.startswith("asyncrl-sglang-initial-")
    assert server.tokens_by_version.get("0", 0) > 0 and server.tokens_by_version.get("1", 0) > 0
