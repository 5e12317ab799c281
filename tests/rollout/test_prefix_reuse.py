"""Prefix reuse across turns: the scheduler retains finished samples' KV (fake forward), the forward
prefills a suffix over a reused prefix, and LocalEngine's multi-turn episodes are unchanged by it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import torch

from asyncrl.rollout.engine import LocalEngine, SamplingParams
from asyncrl.rollout.kv_forward import ForwardBatch, SlotKVForward
from asyncrl.types import WeightUpdate
from tests.rollout.test_scheduler import FakeForward, make_scheduler, request, step

TOL = 1e-4  # DESIGN §4 invariant 4 (fp32 on CPU)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def reuse_scheduler(max_slots: int = 4):
    scheduler = make_scheduler(max_slots=max_slots)
    scheduler.prefix_reuse = True
    return scheduler


def finish_one(scheduler, fake, req) -> None:
    """Run ``req`` (max_new=2: a first token, one decode) to its end."""
    scheduler.add([req])
    while req.remaining:
        for done in step(scheduler, fake):
            done.sample.request.remaining -= 1


# ------------------------------------------------------------------ scheduler (fake forward)
def test_a_finished_sample_is_retained_and_the_next_turn_prefills_only_its_new_tokens(loop):
    scheduler, fake = reuse_scheduler(), FakeForward()
    finish_one(scheduler, fake, request(loop, [1, 2, 3], max_new=2))
    # output [100, 4]: the last token's KV was never computed, so the slot holds prompt + [100]
    assert dict(scheduler.retained) == {0: [1, 2, 3, 100]} and scheduler.num_running == 0
    assert scheduler.num_free == 4
    nxt = request(loop, [1, 2, 3, 100, 4, 7, 8], max_new=3)
    scheduler.add([nxt])
    step(scheduler, fake)
    (prefill,) = fake.plans[-1].prefills
    assert prefill.slots == (0,) and prefill.reused == 4
    batch = fake.plans[-1].batch
    assert batch.prefill_prompts == [[4, 7, 8]] and batch.prefill_starts == [4]
    assert fake.plans[-1].num_prefill_tokens == 3 and scheduler.retained == {}
    step(scheduler, fake)
    assert fake.plans[-1].batch.decode_positions == [7]  # decoding goes on after the whole prompt


def test_a_prompt_that_does_not_extend_a_retained_sequence_takes_an_empty_slot(loop):
    scheduler, fake = reuse_scheduler(), FakeForward()
    finish_one(scheduler, fake, request(loop, [1, 2, 3], max_new=2))
    for prompt in ([1, 2, 3, 100], [1, 2, 9, 100, 5], [7]):  # equal (nothing new to prefill), diverging, other
        scheduler.add([request(loop, prompt, max_new=50)])
    step(scheduler, fake)
    assert [(p.slots, p.reused) for p in fake.plans[-1].prefills] == [((1,), 0), ((2,), 0), ((3,), 0)]
    assert fake.plans[-1].batch.prefill_starts == []  # every prompt from position 0
    assert list(scheduler.retained) == [0]


def test_the_longest_retained_prefix_wins_and_a_group_fans_out_from_it(loop):
    scheduler, fake = reuse_scheduler(), FakeForward()
    finish_one(scheduler, fake, request(loop, [1, 2], max_new=2))  # slot 0 holds [1, 2, 100]
    finish_one(scheduler, fake, request(loop, [1, 2, 100, 5], max_new=2))  # slot 0 again: [1, 2, 100, 5, 100]
    finish_one(scheduler, fake, request(loop, [1, 2], max_new=2))  # slot 1: [1, 2, 100]
    assert dict(scheduler.retained) == {0: [1, 2, 100, 5, 100], 1: [1, 2, 100]}
    group = request(loop, [1, 2, 100, 5, 100, 6], n=2, max_new=5)
    scheduler.add([group])
    step(scheduler, fake)
    (prefill,) = fake.plans[-1].prefills
    assert prefill.slots == (0, 2) and prefill.reused == 5  # the sibling takes an empty slot, not slot 1
    assert fake.plans[-1].batch.prefill_prompts == [[6]] and list(scheduler.retained) == [1]


def test_retained_slots_are_evicted_least_recent_first_when_slots_are_needed(loop):
    scheduler, fake = reuse_scheduler(max_slots=2), FakeForward()
    scheduler.add([request(loop, [1, 1], max_new=2), request(loop, [2, 2], max_new=3)])
    for _ in range(3):
        step(scheduler, fake)  # slot 0 ends first, then slot 1
    assert list(scheduler.retained) == [0, 1] and scheduler.num_free == 2
    scheduler.add([request(loop, [9, 9], max_new=50)])  # no match, no empty slot: evict the oldest
    step(scheduler, fake)
    assert fake.plans[-1].prefills[0].slots == (0,) and list(scheduler.retained) == [1]
    assert scheduler.retained_evicted == 1
    late = request(loop, [2, 2, 100, 3, 4], max_new=50)  # still extends slot 1's sequence
    scheduler.add([late])
    step(scheduler, fake)
    assert fake.plans[-1].prefills[0].slots == (1,) and fake.plans[-1].prefills[0].reused == 4


def test_a_weight_update_drops_every_retained_sequence(loop):
    scheduler, fake = reuse_scheduler(), FakeForward()
    finish_one(scheduler, fake, request(loop, [1, 2, 3], max_new=2))
    scheduler.new_weights()
    assert scheduler.retained == {} and scheduler.retained_dropped == 1 and scheduler.num_free == 4
    scheduler.add([request(loop, [1, 2, 3, 100, 4, 5])])
    step(scheduler, fake)
    assert fake.plans[-1].prefills[0].reused == 0 and fake.plans[-1].num_prefill_tokens == 6


def test_aborted_cancelled_and_reuse_off_retain_nothing(loop):
    scheduler, fake = reuse_scheduler(), FakeForward()
    scheduler.add([request(loop, [1, 2], max_new=50), request(loop, [3, 4], max_new=50)])
    step(scheduler, fake)
    scheduler.slots[1].request.cancelled = True
    scheduler.drop_cancelled()
    scheduler.release_running()  # abort
    assert scheduler.retained == {} and scheduler.num_free == 4
    off, fake = make_scheduler(), FakeForward()
    finish_one(off, fake, request(loop, [1, 2, 3], max_new=2))
    assert off.retained == {} and off.num_free == 4


# ------------------------------------------------------------------ the forward
def test_a_suffix_prefilled_over_a_reused_prefix_equals_the_whole_prompt(load_tiny):
    model, _ = load_tiny()
    f = SlotKVForward(model, max_slots=3, max_seq_len=64, device="cpu")
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 90, (30,), generator=gen).tolist()
    other = torch.randint(4, 90, (9,), generator=gen).tolist()
    whole = f.prefill([0], [ids])[0]
    f.prefill([1], [ids[:12] + [5] * 20])  # stale KV past the prefix must not be seen
    _, logits = f.step(ForwardBatch([], [], [], [1, 2], [ids[12:], other], [12, 0]))  # with a fresh prompt
    assert (logits[0] - whole).abs().max().item() < 1e-5
    assert (logits[1] - f.prefill([0], [other])[0]).abs().max().item() < 1e-5
    f.prefill([0], [ids])
    assert (f.k_cache[:, 1, :, :30] - f.k_cache[:, 0, :, :30]).abs().max().item() < 1e-5


# ------------------------------------------------------------------ LocalEngine
async def _episodes(engine: LocalEngine, prompts: list[list[int]], turns: int, sampling: SamplingParams):
    """Scripted multi-turn episodes: each turn appends the model's output and a fixed reply, concurrently."""

    async def one(ids: list[int]):
        outs = []
        for t in range(turns):
            (c,) = await engine.generate(ids, sampling)
            outs.append(c)
            ids = ids + list(c.output_ids) + [7, 8, 9 + t]
        return outs

    return await asyncio.gather(*(one(p) for p in prompts))


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(max_new_tokens=12, greedy=True), SamplingParams(max_new_tokens=12, temperature=1.0, seed=5)],
)
def test_multi_turn_episodes_are_the_same_with_and_without_reuse(load_tiny, arun, sampling):
    prompts = [[5 + i, 6, 7, 8, 9, 10 + i] for i in range(3)]
    results, stats = {}, {}
    for reuse in (False, True):
        model, tok = load_tiny()
        engine = LocalEngine(model, tok, max_slots=4, max_seq_len=256, prefix_reuse=reuse)
        try:
            results[reuse] = arun(_episodes(engine, prompts, 3, sampling))
            stats[reuse] = engine.stats()
        finally:
            engine.close()
    for a_turns, b_turns in zip(results[False], results[True], strict=True):
        for a, b in zip(a_turns, b_turns, strict=True):
            assert a.prompt_ids == b.prompt_ids and a.output_ids == b.output_ids
            assert max(abs(x - y) for x, y in zip(a.behav_logprobs, b.behav_logprobs, strict=True)) <= TOL
    assert stats[True]["prefix_hits"] == 6  # turns 2 and 3 of 3 episodes
    computed = stats[True]["prefill_tokens"] + stats[True]["prefix_reused_tokens"]
    assert computed == stats[False]["prefill_tokens"] and stats[False]["prefix_reused_tokens"] == 0
    assert stats[True]["prefill_tokens"] < stats[False]["prefill_tokens"]


def test_a_weight_update_between_turns_drops_the_retained_kv(load_tiny, arun):
    model, tok = load_tiny()
    state = {k: v.detach().clone() * 1.01 for k, v in model.named_parameters()}
    engine = LocalEngine(model, tok, max_slots=2, max_seq_len=128, prefix_reuse=True)
    sampling = SamplingParams(max_new_tokens=6, greedy=True)

    async def go():
        (first,) = await engine.generate([5, 6, 7], sampling)
        assert engine.stats()["retained_slots"] == 1
        await engine.update_weights(WeightUpdate(version=1, tensors=state))
        (second,) = await engine.generate([5, 6, 7, *first.output_ids, 9], sampling)
        return second

    try:
        second = arun(go())
        stats = engine.stats()
    finally:
        engine.close()
    assert stats["retained_dropped"] == 1 and stats["prefix_hits"] == 0
    assert set(second.versions) == {1}
    ref_model, _ = load_tiny()
    ref_model.load_state_dict(state, strict=False)
    with torch.no_grad():
        ids = list(second.prompt_ids) + list(second.output_ids)
        logp = torch.log_softmax(ref_model(torch.tensor([ids])).logits[0], -1)
    ref = [logp[len(second.prompt_ids) - 1 + i, t].item() for i, t in enumerate(second.output_ids)]
    assert max(abs(a - b) for a, b in zip(ref, second.behav_logprobs, strict=True)) <= TOL
