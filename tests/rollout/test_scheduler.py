"""The engine's scheduler without a model: admission, the step plan and the update, driven by a fake forward."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import torch

from asyncrl.rollout.requests import Request
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.scheduler import Finished, Placement, Scheduler, StepOutput, StepPlan

SCRATCH = 99


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def make_scheduler(max_slots: int = 4, max_seq_len: int = 64, budget: int = 8192) -> Scheduler:
    return Scheduler(max_slots=max_slots, max_seq_len=max_seq_len, prefill_token_budget=budget, scratch_slot=SCRATCH)


def request(loop: asyncio.AbstractEventLoop, prompt: list[int], n: int = 1, max_new: int = 8, stop=()) -> Request:
    sampling = SamplingParams(max_new_tokens=max_new, stop_token_ids=tuple(stop))
    return Request(prompt, sampling, n, 0, loop, loop.create_future())


class FakeForward:
    """Stands in for the forward and the sampler: a decode row emits ``position + 1`` (its input position plus
    one), a prefilled sample's first token is ``100 + sample index``; every step records its plan."""

    def __init__(self, version: int = 0) -> None:
        self.version = version
        self.plans: list[StepPlan] = []

    def first_tokens(self, placements: tuple[Placement, ...]) -> list[int]:
        return [100 + index for p in placements for index in p.indices]

    def execute(self, plan: StepPlan) -> StepOutput:
        self.plans.append(plan)
        decode = [p + 1 for p in plan.batch.decode_positions]
        first = self.first_tokens(plan.prefills)
        logits = torch.zeros(len(plan.prefills), 1) if plan.prefills else None
        return StepOutput(self.version, decode, [0.0] * len(decode), first, [-1.0] * len(first), logits)


def step(scheduler: Scheduler, fake: FakeForward) -> list[Finished]:
    """One engine step as ``LocalEngine._step`` runs it, with the fake in place of forward and sampler."""
    admission = scheduler.admit()
    finished = []
    if admission.joins:
        tokens = fake.first_tokens(admission.joins)
        finished += scheduler.start(admission.joins, tokens, [-2.0] * len(tokens), fake.version)
    plan = scheduler.schedule(admission.prefills)
    if plan is not None:
        finished += scheduler.update(plan, fake.execute(plan))
    return finished


def test_plan_prefills_a_group_once_then_decodes_every_sample(loop):
    scheduler, fake = make_scheduler(), FakeForward()
    scheduler.add([request(loop, [5, 6, 7], n=2), request(loop, [8, 9], n=1)])
    assert step(scheduler, fake) == []
    first = fake.plans[0]
    # one prompt per request, into the first slot of its placement; nothing decodes yet
    assert [p.slots for p in first.prefills] == [(0, 1), (2,)]
    assert first.batch.prefill_slots == [0, 2] and first.batch.prefill_prompts == [[5, 6, 7], [8, 9]]
    assert first.decode_samples == () and first.batch.decode_tokens == [] and first.num_decode == 0
    assert first.num_prefill_tokens == 5
    step(scheduler, fake)
    second = fake.plans[1].batch
    # every sample decodes its first token at the position after its prompt, in its own slot
    assert second.decode_tokens == [100, 101, 100]
    assert second.decode_positions == [3, 3, 2]
    assert second.decode_write_slots == [0, 1, 2]
    assert fake.plans[1].prefills == () and fake.plans[1].num_decode == 3


def test_idle_rows_write_to_the_scratch_slot_and_freed_slots_are_reused_lowest_first(loop):
    scheduler, fake = make_scheduler(), FakeForward()
    short = request(loop, [1, 2], max_new=2)  # ends after its first decode
    scheduler.add([short, request(loop, [3, 4], max_new=8)])
    step(scheduler, fake)
    (done,) = step(scheduler, fake)
    assert done.sample.request is short and done.reason == "length"
    assert done.sample.output_ids == [100, 3] and done.sample.versions == [0, 0]
    assert scheduler.slots[0] is None and scheduler.num_running == 1
    step(scheduler, fake)
    batch = fake.plans[-1].batch
    assert batch.decode_write_slots == [SCRATCH, 1] and batch.decode_tokens == [0, 3]  # slot 0 is idle
    late = request(loop, [7, 7, 7])
    scheduler.add([late])
    step(scheduler, fake)
    assert fake.plans[-1].prefills[0].slots == (0,)  # the lowest free slot


def test_stop_token_and_sequence_limit_end_samples(loop):
    scheduler, fake = make_scheduler(max_seq_len=6), FakeForward()
    stopping = request(loop, [1, 2, 3], stop=(4,))  # decodes position 3 -> token 4: a stop token
    capped = request(loop, [1, 2, 3, 4], max_new=50)  # 6 - 4 = 2 tokens fit in the KV cache
    scheduler.add([stopping, capped])
    step(scheduler, fake)
    finished = step(scheduler, fake)
    assert [(f.sample.request, f.reason) for f in finished] == [(stopping, "stop"), (capped, "length")]
    assert finished[0].sample.output_ids == [100, 4] and scheduler.num_running == 0
    assert scheduler.schedule(()) is None  # nothing left to compute


def test_a_group_that_only_partly_fits_joins_later_from_a_running_sibling(loop):
    scheduler, fake = make_scheduler(max_slots=3), FakeForward()
    blocker = request(loop, [9, 9], max_new=2)
    group = request(loop, [5, 6, 7, 8], n=3, max_new=20)
    scheduler.add([blocker, group])
    step(scheduler, fake)
    assert [p.slots for p in fake.plans[0].prefills] == [(0,), (1, 2)]
    assert list(group.pending) == [2] and group.prompt_logits is not None  # cached for the sample still waiting
    step(scheduler, fake)  # the blocker ends: its slot frees
    admission = scheduler.admit()
    (join,) = admission.joins
    assert admission.prefills == ()
    assert join.slots == (0,) and join.indices == (2,) and join.kv_source == 1  # copies slot 1's prompt KV
    scheduler.start(admission.joins, [102], [-2.0], 0)
    assert group.prompt_logits is None and group.prompt_logits_epoch == -1  # every sample placed: dropped
    plan = scheduler.schedule(admission.prefills)
    assert plan is not None and plan.num_decode == 3  # the joined sample decodes in this very step
    assert plan.batch.decode_tokens[0] == 102 and plan.batch.decode_positions[0] == 4


def test_cached_prompt_logits_are_stale_after_a_weight_update(loop):
    scheduler, fake = make_scheduler(max_slots=2), FakeForward()
    blocker = request(loop, [9, 9], max_new=2)
    group = request(loop, [5, 6, 7], n=2, max_new=20)
    scheduler.add([blocker, group])
    step(scheduler, fake)
    step(scheduler, fake)  # the blocker ends
    scheduler.new_weights()
    admission = scheduler.admit()
    assert admission.joins == () and [p.slots for p in admission.prefills] == [(0,)]  # prefilled again


def test_a_group_whose_siblings_all_ended_is_prefilled_again(loop):
    scheduler, fake = make_scheduler(max_slots=1), FakeForward()
    group = request(loop, [5, 6, 7], n=2, max_new=1)
    scheduler.add([group])
    (done,) = step(scheduler, fake)  # sample 0 ends on its first token; no sibling keeps the prompt's KV
    assert done.sample.index == 0 and not group.live_slots
    admission = scheduler.admit()
    assert admission.joins == () and admission.prefills[0].indices == (1,)


def test_prefill_budget_defers_prompts_but_the_first_always_goes(loop):
    scheduler, fake = make_scheduler(budget=4), FakeForward()
    scheduler.add([request(loop, [1] * 6), request(loop, [2] * 3), request(loop, [3] * 2)])
    step(scheduler, fake)
    assert [len(p.request.prompt) for p in fake.plans[0].prefills] == [6]  # over budget, but first
    step(scheduler, fake)
    assert [len(p.request.prompt) for p in fake.plans[1].prefills] == [3]  # 3 + 2 > 4: one at a time
    step(scheduler, fake)
    assert [len(p.request.prompt) for p in fake.plans[2].prefills] == [2]


def test_cancelled_requests_leave_their_slots_and_the_queue(loop):
    scheduler, fake = make_scheduler(max_slots=2), FakeForward()
    running, queued, after = request(loop, [1, 2], n=2), request(loop, [3]), request(loop, [4])
    scheduler.add([running, queued, after])
    step(scheduler, fake)
    running.cancelled = queued.cancelled = True
    scheduler.drop_cancelled()
    assert scheduler.num_running == 0 and list(scheduler.waiting) == [after]
    assert scheduler.requests() == [after]


def test_release_running_frees_every_slot_in_slot_order(loop):
    scheduler, fake = make_scheduler(), FakeForward()
    scheduler.add([request(loop, [1], n=2), request(loop, [2])])
    step(scheduler, fake)
    released = scheduler.release_running()
    assert [(s.request.prompt, s.index) for s in released] == [([1], 0), ([1], 1), ([2], 0)]
    assert scheduler.num_running == 0 and scheduler.running() == []


def test_every_sample_of_many_groups_completes_with_its_own_tokens(loop):
    scheduler, fake = make_scheduler(max_slots=3, budget=6), FakeForward(version=7)
    requests = [request(loop, [i + 1] * (i + 2), n=1 + i % 3, max_new=3 + i) for i in range(6)]
    scheduler.add(requests)
    ended: list[Finished] = []
    for _ in range(100):
        ended += step(scheduler, fake)
    assert scheduler.num_running == 0 and scheduler.num_waiting == 0
    assert sorted((id(f.sample.request), f.sample.index) for f in ended) == sorted(
        (id(r), i) for r in requests for i in range(len(r.seeds))
    )
    for f in ended:
        prompt_len, s = len(f.sample.request.prompt), f.sample
        first = 100 + s.index
        assert s.output_ids == [first] + [prompt_len + k + 1 for k in range(len(s.output_ids) - 1)]
        assert len(s.output_ids) == s.request.sampling.max_new_tokens and f.reason == "length"
        assert set(s.versions) == {7}
