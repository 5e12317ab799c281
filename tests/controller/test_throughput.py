"""The steady-state throughput measure: inventory carried into the window does not flatter it."""

from __future__ import annotations

import math

import pytest

from asyncrl.controller.throughput import measure_throughput
from benchmarks.stats import mean_ci95, t95, time_to_target


def _timeline(rate_before: float, rate_after: float, switch_s: float, end_s: float) -> list[dict]:
    """Engine counter samples every second: ``rate_before`` tokens/s until ``switch_s``, then ``rate_after``."""
    out, total = [], 0.0
    for t in range(int(end_s) + 1):
        out.append({"t": float(t), "engine_generated_tokens": total})
        total += rate_before if t < switch_s else rate_after
    return out


def test_inventory_carried_into_the_window_does_not_flatter_it() -> None:
    # A run that generated 100 k tokens in its first 60 s while training almost nothing (inventory),
    # then generates 1000 tok/s and trains 160 k tokens in the next 60 s (old samples + new ones).
    timeline = _timeline(100_000 / 60, 1000, 60, 120)
    metrics = [{"time_s": 30.0, "trained_tokens": 0}, {"time_s": 120.0, "trained_tokens": 160_000}]
    ledger = [{"status": "trained", "response_len": 160_000}]  # every finished token was trained
    speed = measure_throughput(metrics, ledger, timeline, warmup_s=60)
    assert speed.window_trained_tokens_per_s == pytest.approx(160_000 / 60)  # the flattered measure
    assert speed.steady_state_tokens_per_s == pytest.approx(1000, rel=1e-6)  # what the pipeline produced
    assert speed.whole_run_tokens_per_s == pytest.approx(160_000 / 120)


def test_untrained_generation_is_discounted_by_the_trained_per_generated_ratio() -> None:
    timeline = _timeline(1000, 1000, 0, 100)
    metrics = [{"time_s": float(t), "trained_tokens": 4950} for t in range(10, 101, 10)]
    ledger = [
        {"status": "trained", "response_len": 50_000},
        {"status": "filtered", "response_len": 49_000},
        {"status": "in_flight", "response_len": 1000},
    ]
    speed = measure_throughput(metrics, ledger, timeline, warmup_s=20)
    assert speed.trained_per_generated == pytest.approx(0.5)
    assert speed.generated_in_window == pytest.approx(80_000)
    assert speed.never_finished_tokens == pytest.approx(1000)  # still generating at the end
    assert speed.steady_state_tokens_per_s == pytest.approx((80_000 - 1000) * 0.5 / 80)


def test_a_run_shorter_than_the_warm_up_is_refused() -> None:
    with pytest.raises(ValueError, match="warm-up"):
        measure_throughput([{"time_s": 5.0, "trained_tokens": 1}], [], _timeline(1, 1, 0, 5), warmup_s=10)


def test_mean_ci95_and_t_quantiles() -> None:
    assert t95(1) == pytest.approx(12.706) and t95(2) == pytest.approx(4.303)
    assert t95(100) == pytest.approx(1.984, abs=1e-3)
    stat = mean_ci95([1.0, 2.0, 3.0])
    assert stat["mean"] == pytest.approx(2.0)
    assert stat["low"] == pytest.approx(2.0 - 4.303 / math.sqrt(3))
    assert mean_ci95([4.0])["low"] is None
    assert mean_ci95([1.0, math.inf])["mean"] == math.inf


def test_time_to_target_needs_the_target_held_and_interpolates() -> None:
    curve = [(0.0, 0.2), (10.0, 0.5), (20.0, 0.9), (30.0, 0.6), (40.0, 0.85), (50.0, 0.9)]
    # 0.9 at t=20 is not held at t=30; the crossing that holds lies between t=30 and t=40
    assert time_to_target(curve, 0.8) == pytest.approx(30 + 10 * (0.8 - 0.6) / (0.85 - 0.6))
    assert time_to_target(curve, 0.2) == 0.0
    assert time_to_target(curve, 0.95) == math.inf
    assert time_to_target([(0.0, 0.1), (10.0, 0.95)], 0.9) == pytest.approx(10 * 0.8 / 0.85)
    # the first crossing, held or not: between t=10 and t=20
    assert time_to_target(curve, 0.8, hold=False) == pytest.approx(10 + 10 * (0.8 - 0.5) / (0.9 - 0.5))
    assert time_to_target(curve, 0.95, hold=False) == math.inf


def test_inventory_built_up_inside_the_window_does_not_flatter_it() -> None:
    # 1000 tok/s generated throughout, but the last 40 s of it (40 k tokens) were never trained:
    # they sit in the buffer when the run stops. Counting them would credit 1000 tok/s.
    timeline = _timeline(1000, 1000, 0, 100)
    metrics = [{"time_s": float(t), "trained_tokens": 10_000} for t in range(10, 61, 10)]
    ledger = [{"status": "trained", "response_len": 60_000}, {"status": "unused", "response_len": 40_000}]
    metrics.append({"time_s": 100.0, "trained_tokens": 0})  # a last step that trained nothing new
    speed = measure_throughput(metrics, ledger, timeline, warmup_s=0)
    assert speed.never_finished_tokens == pytest.approx(40_000)
    assert speed.steady_state_tokens_per_s == pytest.approx(600)  # what was produced *and* finished
    assert speed.steady_state_tokens_per_s == pytest.approx(speed.whole_run_tokens_per_s)


def test_a_multi_turn_episode_counts_its_model_tokens_as_generated() -> None:
    # Episodes of 30 model + 10 environment tokens (prefilled, never counted by the engine): the engine
    # generates 300 tok/s, every finished episode is trained (40 tokens each), 600 model tokens are
    # still in flight at the end. Counting response_len (40) as generated would hide the in-flight
    # tokens (counter - generated < 0) and under-state the trained tokens per generated one.
    timeline = _timeline(300, 300, 0, 100)
    episodes = (300 * 100 - 600) // 30
    metrics = [{"time_s": 100.0, "trained_tokens": 40 * episodes}]
    ledger = [{"status": "trained", "response_len": 40, "model_tokens": 30, "env_tokens": 10}] * episodes
    speed = measure_throughput(metrics, ledger, timeline, warmup_s=20)
    assert speed.trained_per_generated == pytest.approx(40 / 30)
    assert speed.never_finished_tokens == pytest.approx(600)
    assert speed.steady_state_tokens_per_s == pytest.approx((300 * 80 - 600) * (40 / 30) / 80)
