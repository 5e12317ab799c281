"""``asyncrl report``'s tools.png: held-out accuracy (before, every eval_every steps, after) above the
tool-call rates of rollouts and held-out episodes; a step without attempted calls has no rate."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import asyncrl.controller.report as report  # noqa: E402


def test_tool_use_plot(tmp_path, monkeypatch) -> None:
    metrics = [
        {
            "time_s": 1.0,
            "accuracy": 0.1,
            "episode_turns_mean": 2.0,
            "tool_call_correct_rate": 0.9,
            "tool_call_hit_rate": 0.2,
            "tool_call_malformed_rate": 0.1,
            "episode_tool_call_frac": 0.6,
        },
        {"time_s": 2.0, "accuracy": 0.2, "episode_turns_mean": 1.0},  # nothing attempted: no rate
        {
            "time_s": 3.0,
            "accuracy": 0.3,
            "episode_turns_mean": 2.0,
            "tool_call_hit_rate": 0.4,
            "eval_accuracy": 0.25,
            "eval_tool_call_hit_rate": 0.3,
            "eval_by_kind": {"mul 3x2": {"prompts": 4.0, "accuracy": 0.5, "tool_call_hit_rate": 0.5}},
        },
    ]
    kinds = {"mul 3x2": {"prompts": 4.0, "accuracy": 0.25, "tool_call_hit_rate": 0.25}}  # the calculator's
    summary = {
        "eval_before": {"accuracy": 0.05, "tool_call_hit_rate": 0.1, "episode_tool_call_frac": 0.3, "by_kind": kinds},
        "eval_after": {"accuracy": 0.35, "tool_call_hit_rate": 0.5, "episode_tool_call_frac": 0.9, "by_kind": kinds},
    }
    saved = []
    real_save = report.save_figure
    monkeypatch.setattr(report, "save_figure", lambda fig, path: saved.append(fig) or real_save(fig, path))
    path = report._tool_use(plt, metrics, summary, tmp_path / "tools.png")
    assert path.stat().st_size > 0
    lines = {line.get_label(): line for ax in saved[0].axes for line in ax.get_lines()}
    assert list(lines["held-out accuracy"].get_xdata()) == [0.0, 3.0, 3.0]  # before, step 3's evaluation, after
    assert list(lines["held-out accuracy"].get_ydata()) == [0.05, 0.25, 0.35]
    assert list(lines["calls hitting the needed result (rollouts)"].get_xdata()) == [1.0, 3.0]
    assert list(lines["calls hitting the needed result (held-out)"].get_ydata()) == [0.1, 0.3, 0.5]
    assert list(lines["episodes that call the tool (rollouts)"].get_ydata()) == [0.6]
    assert list(lines["episodes that call the tool (held-out)"].get_ydata()) == [0.3, 0.9]  # before, after
