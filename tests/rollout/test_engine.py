"""LocalEngine unit tests: sampling options, continuous batching, shared prefill, pause, cancel, updates."""

from __future__ import annotations

import asyncio

import pytest
import torch

from asyncrl.rollout.engine import EngineDied, LocalEngine, SamplingParams
from asyncrl.types import WeightUpdate


def hf_logprobs(model, prompt, output, temperature=1.0):
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(output)])).logits[0, len(prompt) - 1 : -1]
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return lp.gather(1, torch.tensor(output)[:, None])[:, 0]


@pytest.fixture
def engine(load_tiny):
    model, tok = load_tiny()
    eng = LocalEngine(model, tok, max_slots=8, max_seq_len=256)
    yield eng
    eng.close()


def prompt_of(eng, text="Q:12+30=?\nA:"):
    return eng.tokenizer(text)["input_ids"]


def test_greedy_matches_transformers_generate(engine, arun):
    p = prompt_of(engine)
    (c,) = arun(engine.generate(p, SamplingParams(max_new_tokens=40, greedy=True)))
    with torch.no_grad():
        ref = engine.model.generate(
            torch.tensor([p]), max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    assert list(c.output_ids) == ref[0, len(p) :].tolist()
    assert c.finish_reason == "length" and c.prompt_ids == tuple(p)
    assert c.versions == (0,) * 40


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 1.0, 0), (0.7, 0.9, 20), (1.3, 0.5, 0)])
def test_behaviour_logprobs_are_untruncated_tempered_softmax(engine, arun, temperature, top_p, top_k):
    p = prompt_of(engine)
    sp = SamplingParams(max_new_tokens=30, temperature=temperature, top_p=top_p, top_k=top_k, seed=1)
    outs = arun(engine.generate(p, sp, n=3))
    for c in outs:
        ref = hf_logprobs(engine.model, p, c.output_ids, temperature)
        assert (ref - torch.tensor(c.behav_logprobs)).abs().max().item() < 1e-4


def test_top_k_one_and_tiny_top_p_are_argmax(engine, arun):
    p = prompt_of(engine)
    (g,) = arun(engine.generate(p, SamplingParams(max_new_tokens=20, greedy=True)))
    for sp in (
        SamplingParams(max_new_tokens=20, top_k=1, seed=5),
        SamplingParams(max_new_tokens=20, top_p=1e-6),
    ):
        (c,) = arun(engine.generate(p, sp))
        assert c.output_ids == g.output_ids


def test_n_samples_share_one_prefill(engine, arun):
    p = prompt_of(engine)
    outs = arun(engine.generate(p, SamplingParams(max_new_tokens=12, seed=7), n=4))
    st = engine.stats()
    assert len(outs) == 4 and st["prefill_tokens"] == len(p)
    assert st["kv_copied_tokens"] == 3 * len(p)
    assert len({c.output_ids for c in outs}) > 1  # different samples, not copies


def test_stop_token_ends_sample_and_is_kept(engine, arun):
    p = prompt_of(engine)
    (g,) = arun(engine.generate(p, SamplingParams(max_new_tokens=40, greedy=True)))
    stop = g.output_ids[6]
    first = g.output_ids.index(stop)
    (c,) = arun(engine.generate(p, SamplingParams(max_new_tokens=40, greedy=True, stop_token_ids=(stop,))))
    assert c.finish_reason == "stop" and c.output_ids == g.output_ids[: first + 1]


def test_per_request_budgets_in_one_batch(engine, arun):
    p = prompt_of(engine)

    async def go():
        budgets = [1, 3, 17, 5, 40, 2, 9, 33, 8, 1, 26]
        outs = await asyncio.gather(
            *(engine.generate(p, SamplingParams(max_new_tokens=b, seed=i)) for i, b in enumerate(budgets))
        )
        return budgets, outs

    budgets, outs = arun(go())
    for b, (c,) in zip(budgets, outs, strict=True):
        assert len(c.output_ids) == b and c.finish_reason == "length"


def test_max_seq_len_caps_output(load_tiny, arun):
    model, tok = load_tiny()
    eng = LocalEngine(model, tok, max_slots=2, max_seq_len=24)
    try:
        p = prompt_of(eng)
        (c,) = arun(eng.generate(p, SamplingParams(max_new_tokens=100, greedy=True)))
        assert len(p) + len(c.output_ids) == 24 and c.finish_reason == "length"
    finally:
        eng.close()


def test_seeded_sample_does_not_depend_on_batch_neighbours(engine, arun):
    p = prompt_of(engine)
    sp = SamplingParams(max_new_tokens=30, seed=1234)
    (alone,) = arun(engine.generate(p, sp))

    async def crowded():
        others = [
            engine.generate(prompt_of(engine, "Q:9*9=?\nA:"), SamplingParams(max_new_tokens=25)) for _ in range(6)
        ]
        res = await asyncio.gather(engine.generate(p, sp), *others)
        return res[0][0]

    assert crowded_output(arun, crowded) == alone.output_ids
    (other,) = arun(engine.generate(p, SamplingParams(max_new_tokens=30, seed=99)))
    assert other.output_ids != alone.output_ids


def crowded_output(arun, fn):
    return arun(fn()).output_ids


def test_continuous_batching_reuses_slots(load_tiny, arun):
    model, tok = load_tiny()
    eng = LocalEngine(model, tok, max_slots=4, max_seq_len=128)
    try:
        p = prompt_of(eng)
        budgets = [2, 30, 3, 4, 30, 2, 5, 3, 30, 2, 4, 3]

        async def go():
            return await asyncio.gather(*(eng.generate(p, SamplingParams(max_new_tokens=b)) for b in budgets))

        outs = arun(go())
        assert [len(o[0].output_ids) for o in outs] == budgets
        st = eng.stats()
        # Static batches of 4 would need 3 x 30 steps; continuous batching fills freed slots at once.
        assert st["decode_steps"] < 50
        assert st["decode_tokens"] + st["requests"] == sum(budgets)
    finally:
        eng.close()


def test_group_larger_than_free_slots_is_admitted_in_parts(load_tiny, arun):
    model, tok = load_tiny()
    eng = LocalEngine(model, tok, max_slots=3, max_seq_len=128)
    try:
        p = prompt_of(eng)

        async def go():
            return await asyncio.gather(
                eng.generate(p, SamplingParams(max_new_tokens=20, seed=1), n=3),
                eng.generate(p, SamplingParams(max_new_tokens=5, seed=2), n=3),
            )

        a, b = arun(go())
        assert [len(c.output_ids) for c in a + b] == [20] * 3 + [5] * 3
        for c in a + b:
            ref = hf_logprobs(eng.model, p, c.output_ids)
            assert (ref - torch.tensor(c.behav_logprobs)).abs().max().item() < 1e-4
    finally:
        eng.close()


def test_invalid_requests_raise(engine, arun):
    p = prompt_of(engine)
    with pytest.raises(ValueError):
        arun(engine.generate([], SamplingParams(max_new_tokens=8)))
    with pytest.raises(ValueError):
        arun(engine.generate([10_000], SamplingParams(max_new_tokens=8)))
    with pytest.raises(ValueError):
        arun(engine.generate([1] * 256, SamplingParams(max_new_tokens=8)))
    with pytest.raises(ValueError):
        arun(engine.generate(p, SamplingParams(max_new_tokens=8), n=9))
    with pytest.raises(ValueError):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError):
        SamplingParams(max_new_tokens=8, top_p=0.0)
    with pytest.raises(ValueError):
        LocalEngine(engine.model, engine.tokenizer, max_slots=2, max_seq_len=64, interrupt_mode="drop")


def test_a_dead_engine_thread_fails_every_call_instead_of_hanging(engine, arun, monkeypatch):
    p = prompt_of(engine)
    (ok,) = arun(engine.generate(p, SamplingParams(max_new_tokens=4, greedy=True)))
    assert ok.output_ids

    def broken_add(requests):  # a failure outside a step: the thread itself dies
        raise RuntimeError("admission bookkeeping broke")

    monkeypatch.setattr(engine.scheduler, "add", broken_add)
    with pytest.raises(EngineDied, match="admission bookkeeping broke"):
        arun(asyncio.wait_for(engine.generate(p, SamplingParams(max_new_tokens=4)), timeout=30))
    engine._thread.join(timeout=10)
    assert not engine._thread.is_alive()
    with pytest.raises(EngineDied):  # later calls fail at once
        arun(asyncio.wait_for(engine.generate(p, SamplingParams(max_new_tokens=4)), timeout=5))
    with pytest.raises(EngineDied):
        arun(asyncio.wait_for(engine.abort_all(), timeout=5))


def test_running_sample_seconds_integrate_the_samples_holding_a_slot(engine, arun):
    import time

    p = prompt_of(engine)
    before = engine.stats()["running_sample_s"]
    started = time.perf_counter()
    outs = arun(engine.generate(p, SamplingParams(max_new_tokens=20, seed=1), n=3))
    wall = time.perf_counter() - started
    st = engine.stats()
    assert [len(c.output_ids) for c in outs] == [20, 20, 20]
    integral = st["running_sample_s"] - before
    # the three run together through every decode step, and never more than three at once
    assert 3 * st["decode_s"] * 0.999 <= integral <= 3 * wall
    time.sleep(0.05)
    assert engine.stats()["running_sample_s"] == pytest.approx(st["running_sample_s"])  # idle: nothing accrues


def test_pause_blocks_decoding_until_resume(engine, arun):
    p = prompt_of(engine)

    async def go():
        await engine.pause()
        task = asyncio.create_task(engine.generate(p, SamplingParams(max_new_tokens=10)))
        await asyncio.sleep(0.2)
        assert not task.done() and engine.stats()["generated_tokens"] == 0
        await engine.resume()
        return await task

    (c,) = arun(go())
    assert len(c.output_ids) == 10


def test_cancelled_request_frees_its_slots(load_tiny, arun):
    model, tok = load_tiny()
    eng = LocalEngine(model, tok, max_slots=2, max_seq_len=256)
    try:
        p = prompt_of(eng)

        async def go():
            task = asyncio.create_task(eng.generate(p, SamplingParams(max_new_tokens=200), n=2))
            while eng.stats()["decode_steps"] < 3:
                await asyncio.sleep(0.005)
            task.cancel()
            return await eng.generate(p, SamplingParams(max_new_tokens=5), n=2)

        outs = arun(go())
        assert [len(c.output_ids) for c in outs] == [5, 5]
        assert eng.stats()["running_samples"] == 0
    finally:
        eng.close()


def test_update_weights_from_disk_and_bad_update(load_tiny, tiny_dir, arun, tmp_path):
    from safetensors.torch import save_file

    model, tok = load_tiny()
    eng = LocalEngine(model, tok, max_slots=2, max_seq_len=128)
    try:
        p = prompt_of(eng)
        new = {k: v.clone() * 0.5 for k, v in model.state_dict().items() if k != "lm_head.weight"}
        save_file(new, str(tmp_path / "model.safetensors"))
        arun(eng.update_weights(WeightUpdate(version=3, path=str(tmp_path))))
        assert eng.version == 3
        (c,) = arun(eng.generate(p, SamplingParams(max_new_tokens=8, seed=0)))
        assert c.versions == (3,) * 8
        ref = hf_logprobs(eng.model, p, c.output_ids)  # the engine's model now holds the new weights
        assert torch.allclose(eng.model.model.embed_tokens.weight, new["model.embed_tokens.weight"])
        assert (ref - torch.tensor(c.behav_logprobs)).abs().max().item() < 1e-4
        with pytest.raises(KeyError):
            arun(eng.update_weights(WeightUpdate(version=4, tensors={"no.such.param": torch.zeros(1)})))
        with pytest.raises(FileNotFoundError):
            arun(eng.update_weights(WeightUpdate(version=4, path=str(tmp_path / "missing"))))
        assert eng.version == 3  # a failed update changes nothing and the engine keeps serving
        (c,) = arun(eng.generate(p, SamplingParams(max_new_tokens=2)))
        assert len(c.output_ids) == 2
    finally:
        eng.close()


def test_abort_mode_returns_partial_output(load_tiny, arun):
    model, tok = load_tiny()
    eng = LocalEngine(model, tok, max_slots=4, max_seq_len=256, interrupt_mode="abort")
    try:
        p = prompt_of(eng)
        state = {k: v.clone() for k, v in model.state_dict().items()}

        async def go():
            task = asyncio.create_task(eng.generate(p, SamplingParams(max_new_tokens=200), n=2))
            while eng.stats()["decode_steps"] < 5:
                await asyncio.sleep(0.002)
            await eng.update_weights(WeightUpdate(version=1, tensors=state))
            return await task

        outs = arun(go())
        for c in outs:
            assert c.finish_reason == "abort" and 0 < len(c.output_ids) < 200
            assert c.num_interruptions == 1 and set(c.versions) == {0}
        assert eng.stats()["aborted_samples"] == 2
    finally:
        eng.close()


def test_close_fails_pending_requests(load_tiny, arun):
    model, tok = load_tiny()
    eng = LocalEngine(model, tok, max_slots=1, max_seq_len=256)
    p = prompt_of(eng)

    async def go():
        task = asyncio.create_task(eng.generate(p, SamplingParams(max_new_tokens=250)))
        await asyncio.sleep(0.05)
        await asyncio.get_running_loop().run_in_executor(None, eng.close)
        return await task

    with pytest.raises(RuntimeError):
        arun(go())
