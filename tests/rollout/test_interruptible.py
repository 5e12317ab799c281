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

    reports_each_sample = False

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


def test_on_sample_done_once_per_sample_with_a_group_at_once_engine(arun):
    eng = ChunkyEngine(chunk=4)  # reports_each_sample is False: generate_group reports for it
    reported: list[int] = []
    outs = arun(generate_group(eng, [1, 2, 3], SamplingParams(max_new_tokens=10, seed=1), 3, reported.append))
    assert sorted(reported) == [0, 1, 2] and all(c.finish_reason == "length" for c in outs)
    reported.clear()
    arun(generate_group(ChunkyEngine(chunk=50), [1], SamplingParams(max_new_tokens=5), 2, reported.append))
    assert sorted(reported) == [0, 1]  # finished in the first call: reported when it returned


class EachEngine:
    """Fake engine that reports samples itself: sample 0 ends in the first call, the others abort."""

    reports_each_sample = True

    def __init__(self) -> None:
        self.calls = 0

    async def generate(self, input_ids, sampling, n=1, on_sample_done=None):
        self.calls += 1
        first = self.calls == 1
        outs = []
        for i in range(n):
            reason = "length" if (not first or i == 0) else "abort"
            k = sampling.max_new_tokens if reason == "length" else 2
            outs.append(Completion(tuple(input_ids), (7,) * k, (-0.1,) * k, (0,) * k, reason, int(reason == "abort")))
            if reason == "length" and on_sample_done is not None:
                on_sample_done(i)
        return outs


def test_on_sample_done_with_an_engine_that_reports_each_sample(arun):
    eng = EachEngine()
    reported: list[int] = []
    outs = arun(generate_group(eng, [1, 2], SamplingParams(max_new_tokens=6, seed=3), 3, reported.append))
    assert reported[0] == 0 and sorted(reported) == [0, 1, 2]  # 0 by the engine, 1 and 2 after their resume
    assert [len(c.output_ids) for c in outs] == [6, 6, 6]


def test_local_engine_reports_each_sample_as_it_ends(load_tiny, arun):
    model, tok = load_tiny()
    eng = LocalEngine(model, tok, max_slots=8, max_seq_len=256)
    p = tok("Q:1+1=?\nA:")["input_ids"]
    stop = tuple(range(0, model.config.vocab_size, 3))  # a third of the vocabulary ends a sample
    try:

        async def go():
            seen: list[tuple[int, bool]] = []
            sampling = SamplingParams(max_new_tokens=100, seed=7, stop_token_ids=stop)
            task = asyncio.create_task(generate_group(eng, p, sampling, 6, lambda i: seen.append((i, task.done()))))
            return seen, await task

        seen, outs = arun(go())
    finally:
        eng.close()
    assert sorted(i for i, _ in seen) == list(range(6))
    assert not any(done for _, done in seen)  # every report came before the group returned
    lens = [len(outs[i].output_ids) for i, _ in seen]
    assert lens == sorted(lens) and len(set(lens)) > 1  # in the order the samples ended
