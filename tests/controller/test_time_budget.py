"""``controller/time_budget.py``: where a run's time went, from hand-made timelines with known answers."""

from __future__ import annotations

import pytest

from asyncrl.controller.time_budget import held_integral, time_budget


def _timeline() -> list[dict]:
    # engine: 10 running for 0-4 s, 30 running for 4-10 s; trainer busy 6-8 s; decoding 8 of 10 s
    return [
        {"t": 0.0, "engine_running": 10, "trainer_busy": False, "engine_decode_s": 100.0, "engine_prefill_s": 1.0},
        {"t": 4.0, "engine_running": 30, "trainer_busy": False, "engine_decode_s": 103.0, "engine_prefill_s": 1.5},
        {"t": 6.0, "engine_running": 30, "trainer_busy": True, "engine_decode_s": 105.0, "engine_prefill_s": 1.5},
        {"t": 8.0, "engine_running": 30, "trainer_busy": False, "engine_decode_s": 106.0, "engine_prefill_s": 2.0},
        {"t": 10.0, "engine_running": 30, "trainer_busy": False, "engine_decode_s": 108.0, "engine_prefill_s": 2.0},
        {"t": 12.0, "engine_running": 99, "trainer_busy": True, "engine_decode_s": 200.0, "engine_prefill_s": 9.0},
    ]  # after the last step (t = 10): not counted


def test_time_budget_known_answers() -> None:
    metrics = [{"time_s": 3.0, "response_len": 100}, {"time_s": 7.0, "response_len": 300}, {"time_s": 10.0}]
    out = time_budget(metrics, _timeline(), checkpoints_s=(5.0, 10.0), early_steps=2)
    assert out["rl_wall_s"] == 10.0
    assert out["engine_decode_s"] == 8.0 and out["engine_decode_frac"] == pytest.approx(0.8)
    assert out["engine_prefill_s"] == 1.0 and out["engine_update_s"] == 0.0
    assert out["mean_engine_running"] == pytest.approx((10 * 4 + 30 * 6) / 10)
    assert out["trainer_busy_frac"] == pytest.approx(0.2)
    assert out["steps_by_s"] == {"5": 1, "10": 3}
    assert out["early_response_len"] == 200.0


def test_time_budget_refuses_an_empty_run() -> None:
    with pytest.raises(ValueError, match="no training step"):
        time_budget([], _timeline())
    with pytest.raises(ValueError, match="no timeline"):
        time_budget([{"time_s": 1.0}], [])


def test_held_integral_holds_each_sample_until_the_next_within_the_window() -> None:
    points = [(1.0, 2.0), (3.0, 4.0), (6.0, 1.0)]
    assert held_integral(points, 0.0, 5.0) == (2.0 * 2 + 4.0 * 2, 4.0)  # nothing before the first sample
    assert held_integral(points, 2.0, 8.0) == (2.0 * 1 + 4.0 * 3 + 1.0 * 2, 6.0)  # the last held until the end
    assert held_integral([], 0.0, 5.0) == (0.0, 0.0)
