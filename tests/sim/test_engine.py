"""The simulated engine, step by step: hand-computed times for joins, decode steps, sample ends,
weight updates (keep, abort: the re-prefill), the FIFO queue and the router."""

from __future__ import annotations

import math

import pytest

from asyncrl.sim.engine import SimEngine
from asyncrl.sim.groups import SimGroup
from asyncrl.sim.pool import EngineTotals, Router
from asyncrl.sim.profile import EngineCost

A, B, C, P = 0.01, 0.001, 0.0001, 0.002


def engine(per_sample: bool = True, slots: int = 8, update_s: float = 0.1, **cost: float) -> tuple[SimEngine, list]:
    ends: list[tuple[int, float, int, int]] = []
    costs = {
        "decode_base_s": A,
        "decode_per_seq_s": B,
        "decode_per_ctx_token_s": C,
        "prefill_per_token_s": P,
        "update_s": update_s,
        **cost,
    }
    eng = SimEngine(
        0, EngineCost(**costs), slots, lambda g, t, n, i: ends.append((g.gid, t, n, i)), EngineTotals(), per_sample
    )
    return eng, ends


def run_to_end(eng: SimEngine) -> None:
    eng.schedule()
    while eng.run:
        eng.fire()


def span(k: int, n: int, ctx: int) -> float:
    return k * (A + B * n + C * ctx) + 0.5 * C * n * k * (k - 1)


def test_a_group_decodes_as_computed_by_hand() -> None:
    eng, ends = engine()
    grp = SimGroup(1, prompt_len=4, lengths=[3, 5], admit_version=0)
    assert eng.submit(grp, list(grp.lengths), now=0.0)
    run_to_end(eng)
    t_join = 4 * P  # one shared prefill of the prompt
    t_first = t_join + span(2, 2, 2 * 5)  # both sampled 1 token at the join: contexts 4 + 1
    t_second = t_first + span(2, 1, 4 + 3)  # the 5-token sample alone, 3 tokens generated
    assert [(g, n) for g, _, n, _ in ends] == [(1, 3), (1, 5)]
    assert ends[0][1] == pytest.approx(t_first)
    assert ends[1][1] == pytest.approx(t_second)
    assert eng.tot.generated == 8 and eng.tot.decode_steps == 4 and eng.tot.decode_tokens == 6
    assert eng.tot.prefill_tokens == 4
    assert grp.left == 0 and grp.min_version == 0 and grp.interrupts == 0


def test_without_reports_only_the_group_end_is_an_event() -> None:
    eng, ends = engine(per_sample=False)
    grp = SimGroup(1, prompt_len=4, lengths=[3, 5], admit_version=0)
    eng.submit(grp, list(grp.lengths), now=0.0)
    eng.schedule()
    eng.fire()  # one event: straight to the group's last sample
    assert not eng.run and [n for _, _, n, _ in ends] == [5]
    reference, ref_ends = engine(per_sample=True)
    grp2 = SimGroup(1, prompt_len=4, lengths=[3, 5], admit_version=0)
    reference.submit(grp2, list(grp2.lengths), now=0.0)
    run_to_end(reference)
    assert ends[-1][1] == pytest.approx(ref_ends[-1][1], rel=1e-12)


@pytest.mark.parametrize("abort", [False, True])
def test_a_weight_update_pauses_and_abort_re_prefills(abort: bool) -> None:
    eng, ends = engine(update_s=0.1, decode_per_seq_s=0.0, decode_per_ctx_token_s=0.0)
    grp = SimGroup(1, prompt_len=5, lengths=[10], admit_version=0)
    eng.submit(grp, [10], now=0.0)
    eng.schedule()
    t0 = 5 * P  # prefill, then 9 decode steps of A each
    now = t0 + 3.5 * A
    loaded = eng.update(now, version=1, abort=abort)
    # the step in progress ends (4 steps done), then the pause
    assert loaded == pytest.approx(t0 + 4 * A + 0.1)
    run_to_end(eng)
    if abort:  # prompt + 4 tokens re-prefilled, and the prefill samples the 5th token
        expected = loaded + (5 + 1 + 4) * P + 4 * A
        assert eng.tot.prefill_tokens == 5 + 10
    else:
        expected = loaded + 5 * A
        assert eng.tot.prefill_tokens == 5
    assert ends[-1][1] == pytest.approx(expected)
    assert ends[-1][3] == 1  # one interruption
    assert eng.tot.generated == 10
    assert grp.min_version == 0 and grp.max_version == 1


def test_abort_resubmits_behind_waiting_requests() -> None:
    eng, ends = engine(slots=1, update_s=0.0)
    first = SimGroup(1, prompt_len=2, lengths=[20], admit_version=0)
    second = SimGroup(2, prompt_len=2, lengths=[3], admit_version=0)
    eng.submit(first, [20], now=0.0)
    eng.submit(second, [3], now=0.0)  # waits: one slot
    eng.schedule()
    eng.update(0.05, version=1, abort=True)  # first returns its partial output, queued behind second
    run_to_end(eng)
    assert [g for g, *_ in ends] == [2, 1]
    assert second.min_version == 1 and first.min_version == 0  # first's oldest token is from version 0


def test_kv_capacity_limits_joins() -> None:
    eng, _ = engine(slots=8, kv_capacity_tokens=25)
    grp = SimGroup(1, prompt_len=10, lengths=[5, 5, 5], admit_version=0)
    eng.submit(grp, list(grp.lengths), now=0.0)
    assert len(eng.run) == 2 and len(eng.waiting) == 1  # 2 x (10 + 1) fit in 25, a third does not


def test_an_idle_engine_waits_for_work() -> None:
    eng, _ = engine()
    eng.schedule()
    assert math.isinf(eng.next_t)
    grp = SimGroup(1, prompt_len=1, lengths=[1], admit_version=0)
    eng.submit(grp, [1], now=2.0)  # a one-token sample ends at its join
    assert eng.t == pytest.approx(2.0 + P) and grp.left == 0


def test_router_picks_the_least_loaded_engine_lowest_index_first() -> None:
    r = Router(3)
    assert r.pick() == 0
    r.add(0, 8)
    assert r.pick() == 1
    r.add(1, 8)
    r.add(2, 4)
    assert r.pick() == 2
    r.add(0, -8)
    assert r.pick() == 0
    for _ in range(200):  # outdated heap entries are dropped, the answer stays right
        r.add(1, 1)
        r.add(1, -1)
    assert r.pick() == 0 and r.load == [0, 8, 4]
