"""``asyncrl bench agent-learning``'s analysis: a seed's row from its run's summary and metrics (gain in
points, tool-use rates before and after, wall times with the warm start, the budget check, the curve
on the wall clock since the warm start began), means with 95% intervals, the seeds meeting the
criterion, and the plot."""

from __future__ import annotations

import pytest

from asyncrl.bench.agent_learning import analyse, plot_curves, seed_row


def _summary(before: float, after: float, hit_before: float, hit_after: float, rl_s: float) -> dict:
    return {
        "accuracy_before": before, "accuracy_after": after, "accuracy_mode": "greedy",
        "eval_before": {"accuracy": before, "tool_call_hit_rate": hit_before, "tool_call_correct_rate": 0.9,
                        "episode_turns_mean": 2.0},
        "eval_after": {"accuracy": after, "tool_call_hit_rate": hit_after, "tool_call_correct_rate": 1.0,
                       "episode_turns_mean": 2.0},
        "steps": 30, "rl_wall_s": rl_s, "wall_s": rl_s + 20.0,
    }  # fmt: skip


METRICS = [{"step": 10, "time_s": 100.0, "eval_accuracy": 0.3, "eval_tool_call_hit_rate": 0.35}, {"step": 11}]


def test_a_seed_row() -> None:
    row = seed_row(3, _summary(0.1, 0.35, 0.2, 0.5, 300.0), METRICS, warm_start_s=200.0, budget_s=600.0)
    assert row["gain_points"] == pytest.approx(25.0)
    assert row["tool_call_hit_rate_before"] == 0.2 and row["tool_call_hit_rate_after"] == 0.5
    assert row["tool_call_malformed_rate_after"] is None  # not measured: None, never 0
    assert row["train_wall_s"] == 500.0 and row["total_wall_s"] == 520.0 and row["within_budget"]
    assert row["curve"] == [(200.0, 0.1, 0.2), (300.0, 0.3, 0.35), (500.0, 0.35, 0.5)]
    late = seed_row(3, _summary(0.1, 0.35, 0.2, 0.5, 450.0), METRICS, warm_start_s=200.0, budget_s=600.0)
    assert not late["within_budget"]


def test_analysis_over_seeds(tmp_path) -> None:
    rows = [
        seed_row(0, _summary(0.10, 0.40, 0.2, 0.5, 300.0), METRICS, 200.0, 600.0),  # +30, in budget
        seed_row(1, _summary(0.10, 0.25, 0.2, 0.4, 300.0), METRICS, 200.0, 600.0),  # +15
        seed_row(2, _summary(0.10, 0.40, 0.3, 0.3, 500.0), METRICS, 200.0, 600.0),  # +30 but over budget
    ]
    result = analyse(rows, 600.0)
    gain = result["summary"]["gain_points"]
    assert gain["n"] == 3 and gain["mean"] == pytest.approx(25.0) and gain["low"] < 25.0 < gain["high"]
    assert result["criterion"]["seeds_met"] == [0]
    assert result["criterion"]["seeds_hit_rate_rose"] == [0, 1]
    assert result["summary"]["warm_start_s"]["mean"] == 200.0
    plot_curves(rows, tmp_path / "curves.png", 600.0)
    assert (tmp_path / "curves.png").stat().st_size > 0
