"""generate_group: resubmission after aborts, merging of chunks, budgets and seeds (fake and real engine)."""

from __future__ import annotations

import asyncio

import torch

from asyncrl.rollout.engine import LocalEngine
from asyncrl.rollout.interruptible import generate_group
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Completion, WeightUpdate


class ChunkyEngine:
    """Fake engine: emits tokens 100, 101, ... and aborts every `chunk` tokens (version bumps on abort)."""

    def __init__(self, chunk: int, stop_at: int | None = None):
        self.chunk, self.stop_at, self.version, self.calls = chunk, stop_at, 0, []

    async def generate(self, input_ids, sampling, n=1):
        self.calls.append((tuple(input_ids), sampling, n))
        outs = []
        for _ in range(n):
            start = len(input_ids)
            k = min(self.chunk, sampling.max_new_tokens)
            ids = tuple(100 + start + j for j in range(k))
            reason = "length" if k == sampling.max_new_tokens else "abort"
            if self.stop_at is not None and self.stop_at in ids:
                ids = ids[: ids.index(self.stop_at) + 1]
                reason = "stop"
            outs.append(
                Completion(
                    tuple(input_ids),
                    ids,
                    (-0.5,) * len(ids),
                    (self.version,) * len(ids),
                    reason,
                    1 if reason == "abort" else 0,
                )
            )
        self.version += 1
        return outs


def test_merges_chunks_with_remaining_budget_and_original_prompt(arun):
    eng = ChunkyEngine(chunk=4)
    outs = arun(generate_group(eng, [1, 2, 3], SamplingParams(max_new_tokens=10, seed=40), n=2))
    for c in outs:
        assert c.prompt_ids == (1, 2, 3)
        assert c.output_ids == tuple(103 + j for j in range(10))
        assert c.versions[:4] == (0,) * 4 and c.finish_reason == "length"
        assert c.num_interruptions == 2 and len(c.behav_logprobs) == 10
    resubmits = eng.calls[1:]
    assert {(len(ids), sp.max_new_tokens, n) for ids, sp, n in resubmits} == {(7, 6, 1), (11, 2, 1)}
    assert sorted(sp.seed for _, sp, _ in resubmits) == [40, 40, 41, 41]  # sample i keeps seed + i


def test_stop_inside_a_resubmitted_chunk(arun):
    eng = ChunkyEngine(chunk=3, stop_at=108)
    (c,) = arun(generate_group(eng, [0, 0], SamplingParams(max_new_tokens=50), n=1))
    assert c.output_ids[-1] == 108 and c.finish_reason == "stop" and len(c.output_ids) == 7


def test_real_engine_abort_updates_resume_to_full_budget(load_tiny, arun):
    model, tok = load_tiny()
    eng = LocalEngine(model, tok, max_slots=8, max_seq_len=256, interrupt_mode="abort")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    p = tok("Q:1+1=?\nA:")["input_ids"]
    try:

        async def go():
            task = asyncio.create_task(generate_group(eng, p, SamplingParams(max_new_tokens=120), 4))
            for v in (1, 2):
                start = eng.stats()["decode_steps"]
                while eng.stats()["decode_steps"] < start + 10:
                    await asyncio.sleep(0.002)
                await eng.update_weights(WeightUpdate(version=v, tensors=state))
            return await task

        outs = arun(go())
        for c in outs:
            assert len(c.output_ids) == 120 and c.finish_reason == "length"
            assert c.num_interruptions == 2 and set(c.versions) == {0, 1, 2}
            assert list(c.versions) == sorted(c.versions)
            assert c.prompt_ids == tuple(p)
        assert eng.stats()["prefill_tokens"] > len(p)  # the partial outputs were re-prefilled
        assert torch.isfinite(torch.tensor(outs[0].behav_logprobs)).all()
    finally:
        eng.close()
