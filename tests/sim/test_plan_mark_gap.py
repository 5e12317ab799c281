"""``scripts/plan_mark_gap.py``'s arithmetic on hand-made metrics lines: the step-time sums and the
per-window decode cost it reads from real and simulated runs alike."""

from __future__ import annotations

import pytest

from tests.script_module import load_script


@pytest.fixture(scope="module")
def gap():
    return load_script("plan_mark_gap")


def _line(wait: float, train: float, sync: float, wall: float, tokens: int) -> dict:
    return {
        "wait_for_batch_s": wait,
        "train_step_s": train,
        "weight_sync_s": sync,
        "step_wall_s": wall,
        "trained_tokens": tokens,
    }


def test_step_budget_skips_the_first_steps_and_keeps_the_rest_of_the_wall(gap) -> None:
    lines = [_line(9.0, 9.0, 9.0, 99.0, 9)] * gap.SKIP_STEPS
    lines += [_line(0.1, 0.4, 0.02, 0.53, 1000), _line(0.0, 0.5, 0.03, 0.54, 1000)]
    budget = gap.step_budget(lines)
    assert budget["steps"] == 2
    assert budget["wait_for_batch_s"] == pytest.approx(0.1)
    assert budget["other_s"] == pytest.approx(1.07 - 0.1 - 0.9 - 0.05)
    assert budget["train_s_per_token"] == pytest.approx(0.9 / 2000)
    assert budget["steps_waiting"] == 1


def test_decode_windows_count_steps_from_the_occupancy(gap) -> None:
    # 1,000 tokens generated in the window, 40 of them first tokens of new samples (prefill), the rest
    # decoded at a quarter of 128 slots: 960 / 32 = 30 decode steps, 0.2 s busy
    line = {
        "engine_slot_occupancy": 0.25,
        "generated_tokens_per_s": 2000.0,
        "step_wall_s": 0.5,
        "rollout_samples": 40,
        "interruptions_per_sample": 0.0,
        "engine_busy_frac": 0.4,
    }
    [(running, steps, busy)] = gap.decode_windows([line, {"engine_slot_occupancy": 0}], 128)
    assert (running, steps, busy) == pytest.approx((32.0, 30.0, 0.2))


def test_ms_per_step_pools_the_windows_of_a_bin(gap) -> None:
    pooled = gap.ms_per_step_by_running([(25.0, 10.0, 0.04), (29.0, 30.0, 0.08), (100.0, 5.0, 0.05)])
    assert pooled["20-30"]["ms_per_step"] == pytest.approx(1e3 * 0.12 / 40)
    assert pooled["20-30"]["decode_steps"] == 40
    assert pooled["80-129"]["ms_per_step"] == pytest.approx(10.0)
    assert set(pooled) == {"20-30", "80-129"}
