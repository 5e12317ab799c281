"""``LocalEngine``'s slot layout in the simulator: the attention keys agree with the real engine's
own split (``SlotKVForward.plan_split``), slots are taken lowest first and emptied slots stay idle
rows, and a simulated engine with the layout costs every decode step by that layout."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from asyncrl.rollout.kv_forward import SlotKVForward
from asyncrl.sim.engine import SimEngine
from asyncrl.sim.groups import SimGroup
from asyncrl.sim.layout import SPLIT_MIN_KEYS, SlotLayout
from asyncrl.sim.pool import EngineTotals
from asyncrl.sim.profile import EngineCost

A, B, C = 0.01, 0.001, 0.0001


def real_keys(positions: list[int]) -> int:
    """Attention keys of one decode step of ``LocalEngine`` with these row positions (idle rows: 0)."""
    fake = SimpleNamespace(split_min_keys=SPLIT_MIN_KEYS)
    short, long_rows = SlotKVForward.plan_split(fake, positions)  # type: ignore[arg-type]
    return len(positions) * short + len(long_rows) * (max(positions) + 1)


@pytest.mark.parametrize("seed", range(20))
def test_keys_agree_with_the_engines_own_split(seed: int) -> None:
    rng = random.Random(seed)
    slots = rng.choice([4, 16, 64, 128])
    layout = SlotLayout(slots, A, B, C)
    held = [(layout.take(u), u) for u in (rng.randint(0, 400) for _ in range(rng.randint(1, slots)))]
    for slot, u in rng.sample(held, rng.randint(0, len(held) - 1)):  # some end: idle rows below others
        layout.release(slot, u)
        held.remove((slot, u))
    step = rng.randint(0, 300)
    positions = [0] * layout.rows
    for slot, u in held:
        positions[slot] = step + u
    keys, _ = layout.keys(step)
    assert keys == real_keys(positions)
    cost, _ = layout.cost(step)
    assert cost == pytest.approx(A + B * len(held) + C * keys)


def test_slots_are_taken_lowest_first_and_rows_shrink_only_from_the_top() -> None:
    layout = SlotLayout(8, A, B, C)
    assert [layout.take(u) for u in (5, 1, 9)] == [0, 1, 2]
    layout.release(1, 1)
    assert layout.rows == 3  # slot 1 is an idle row below slot 2
    assert layout.take(7) == 1  # the lowest free slot again
    layout.release(2, 9)
    layout.release(1, 7)
    assert layout.rows == 1
    layout.hide(0, 5)
    assert layout.rows == 0 and layout.keys(10) == (0, 0)
    layout.show(0, 5)
    assert layout.rows == 1 and layout.us == [5]


def test_growth_is_the_keys_added_per_step_between_changes() -> None:
    layout = SlotLayout(16, A, B, C)
    for u in (10, 20, 30):  # few rows: no split, every row over the longest length
        layout.take(u)
    keys0, growth = layout.keys(100)
    assert keys0 == 3 * 131 and growth == 3
    assert layout.keys(101)[0] == keys0 + growth


def layout_engine(slots: int) -> tuple[SimEngine, list[tuple[int, float]]]:
    ends: list[tuple[int, float]] = []
    cost = EngineCost(A, B, C, prefill_per_token_s=0.0, update_s=0.0, slot_prefix_rows=True)
    eng = SimEngine(0, cost, slots, lambda g, t, n, i: ends.append((n, t)), EngineTotals(), True)
    return eng, ends


def test_an_engine_with_the_layout_pays_each_step_by_its_rows_and_padding() -> None:
    eng, ends = layout_engine(slots=4)
    lengths = [3, 9, 5, 7]
    grp = SimGroup(1, prompt_len=2, lengths=list(lengths), admit_version=0)
    eng.submit(grp, list(lengths), now=0.0)
    slot_of = {final - 2: slot for _, _, _, final, _, slot in eng.run}  # response length -> slot
    eng.schedule()
    while eng.run:
        eng.fire()
    # step by step: every running sample at position prompt + tokens so far; rows up to the highest
    # slot still running; fewer than 8 rows, so every row attends over the longest length
    expected, t = {}, 0.0
    for step in range(1, max(lengths)):
        running = [n for n in lengths if n > step]
        rows = max(slot_of[n] for n in running) + 1
        longest = 2 + step + 1
        t += A + B * len(running) + C * rows * longest
        for n in lengths:
            if n == step + 1:
                expected[n] = t
    assert dict(ends) == pytest.approx(expected)
    assert eng.tot.decode_s == pytest.approx(t)


def test_a_packed_engine_is_unchanged_by_the_layout_code() -> None:
    cost = EngineCost(A, B, C, prefill_per_token_s=0.0, update_s=0.0)
    eng = SimEngine(0, cost, 4, lambda g, t, n, i: None, EngineTotals(), True)
    grp = SimGroup(1, prompt_len=2, lengths=[3, 9], admit_version=0)
    eng.submit(grp, [3, 9], now=0.0)
    assert eng.layout is None and all(entry[5] == -1 for entry in eng.run)
