"""``python -m benchmarks agent-throughput``: the analysis (η = 4 / η = 0 ratios paired by seed, their mean and
95% interval, the seeds at 2x, each arm's throughput and tool-wait share), a run's tool waits from its
ledger and timeline, the plot, the command line's checks, and a tiny run of the whole bench."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import agent_throughput
from benchmarks.__main__ import main as bench_main
from benchmarks.agent_throughput import analyse, plot, reanalyse, run_agent_throughput_bench, tool_wait_row


def _row(seed: int, eta: int, steady: float | None, whole: float, share: float) -> dict:
    return {
        "seed": seed,
        "max_staleness": eta,
        "steady_state_tokens_per_s": steady,
        "trained_tokens_per_s": whole,
        "tool_wait_share": share,
        "staleness_mean": 0.0 if eta == 0 else 1.5,
    }


ROWS = [
    _row(0, 0, 100.0, 90.0, 0.5),
    _row(0, 4, 250.0, 200.0, 0.3),  # 2.5x
    _row(1, 0, 100.0, 100.0, 0.5),
    _row(1, 4, 180.0, 150.0, 0.3),  # 1.8x
    _row(2, 0, 50.0, 40.0, 0.6),
    _row(2, 4, 110.0, 100.0, 0.2),  # 2.2x
    _row(3, 4, 500.0, 400.0, 0.1),  # no synchronous run of seed 3: not paired
]


def test_ratios_are_paired_by_seed() -> None:
    result = analyse(ROWS)
    per_seed = {s["seed"]: s for s in result["per_seed"]}
    assert sorted(per_seed) == [0, 1, 2]
    assert per_seed[0]["steady_state_ratio"] == pytest.approx(2.5) and per_seed[1]["whole_run_ratio"] == 1.5
    assert per_seed[2]["sync_tool_wait_share"] == 0.6 and per_seed[2]["async_tool_wait_share"] == 0.2
    summary = result["summary"]
    steady = summary["steady_state_ratio"]
    assert steady["n"] == 3 and steady["mean"] == pytest.approx(2.1667, abs=1e-4)
    assert steady["low"] < 2.0 < steady["high"]  # three seeds this spread: the interval reaches below 2x
    assert summary["seeds_at_target"] == [0, 2] and summary["mean_at_target"] and not summary["interval_above_target"]
    assert summary["arms"]["async"]["steady_state_tokens_per_s"]["n"] == 4  # every run of the arm, paired or not
    assert summary["arms"]["sync"]["tool_wait_share"]["mean"] == pytest.approx(1.6 / 3)


def test_a_run_without_a_window_has_no_ratio() -> None:
    rows = [_row(0, 0, 100.0, 90.0, 0.5), _row(0, 4, None, 180.0, 0.3)]  # η = 4 shorter than the warm-up
    (seed,) = analyse(rows)["per_seed"]
    assert seed["steady_state_ratio"] is None and seed["whole_run_ratio"] == 2.0
    summary = analyse(rows)["summary"]
    assert summary["steady_state_ratio"]["n"] == 0 and summary["seeds_at_target"] == []
    assert not summary["mean_at_target"]


def test_tool_wait_row_reads_the_ledger() -> None:
    ledger = [
        {"status": "admitted"},
        {"status": "trained", "turns": [{"tool_wait": [1.0, 1.2]}, {"tool_calls": []}]},
        {"status": "filtered", "turns": [{"tool_wait": [2.0, 3.0]}, {"tool_wait": [4.0, 4.5]}]},
        {"status": "trained", "turns": [{"tool_calls": []}]},
        {"status": "unused", "turns": [{"tool_wait": [5.0, 9.0]}]},  # not finished: its waits are not counted
    ]
    timeline = [{"t": 0.0, "generating_samples": 2}, {"t": 10.0, "generating_samples": 0}]
    row = tool_wait_row(ledger, timeline)
    assert row["episodes"] == 3 and row["tool_waits_per_episode"] == 1.0
    assert row["tool_wait_p50_s"] == pytest.approx(0.5) and row["tool_wait_p90_s"] == pytest.approx(1.0)
    assert row["tool_wait_share"] == pytest.approx((0.2 + 1.0 + 0.5 + 4.0) / 20.0)  # the share reads every line
    empty = tool_wait_row([], timeline)
    assert empty["tool_waits_per_episode"] == 0.0 and empty["tool_wait_p50_s"] is None


def test_plot(tmp_path) -> None:
    payload = {"rows": ROWS, **analyse(ROWS)}
    plot(payload, tmp_path / "agent_throughput.png")
    assert (tmp_path / "agent_throughput.png").stat().st_size > 0


def test_command_line(monkeypatch, tmp_path) -> None:
    seen: dict = {}
    monkeypatch.setattr(agent_throughput, "run_agent_throughput_bench", lambda json_path, **kw: seen.update(kw))
    argv = [
        "agent-throughput",
        "--seeds",
        "3,4",
        "--model",
        str(tmp_path),
        "--sync-setting",
        "threads1-trainer-process",
    ]
    assert bench_main(argv) == 0
    assert seen["seeds"] == (3, 4) and seen["steps"] == 40 and seen["warmup_s"] == 20.0
    assert seen["overrides"] == [f"model.path={tmp_path}"] and seen["sync_setting"] == "threads1-trainer-process"
    assert bench_main(["agent-throughput", "--sync-setting", "fastest"]) == 2
    assert bench_main(["agent-throughput", "--seeds", "one"]) == 2
    assert bench_main(["agent-throughput", "--set", "agent.tool_latency_sigma=-1"]) == 2


def test_a_tiny_run(tiny_policy_dir, tmp_path, monkeypatch) -> None:
    """Both arms of one seed for two steps of the random-init tiny policy (it rarely calls the tool and its
    runs last a second, so the figures say nothing; the fields and the files are what is checked)."""
    out = tmp_path / "agent_throughput.json"
    small = [
        f"model.path={tiny_policy_dir}",
        "rollout.group_size=2",
        "controller.batch_size=2",
        "task.eval_size=2",
        "rollout.max_new_tokens=8",
        "agent.max_turn_tokens=8",
        "agent.max_tokens=24",
        "eval.max_new_tokens=8",
    ]
    result = run_agent_throughput_bench(
        str(out),
        overrides=small,
        seeds=(0,),
        steps=2,
        warmup_s=0.0,
        sync_setting="threads1-trainer-process",
        out_dir=str(tmp_path / "runs"),
    )
    sync, fast = result["rows"]
    assert (sync["max_staleness"], fast["max_staleness"]) == (0, 4) and sync["setting"] == "threads1-trainer-process"
    for row in (sync, fast):
        assert row["steps"] == 2 and row["trained_tokens_per_s"] > 0 and row["steady_state_tokens_per_s"] >= 0
        assert row["episodes"] == 2 * 2 * 2 and row["rl_wall_s"] > 0
        assert {"tool_waits_per_episode", "tool_wait_p50_s", "tool_wait_p90_s", "tool_wait_share"} <= set(row)
    (seed,) = result["per_seed"]
    assert seed["whole_run_ratio"] == pytest.approx(fast["trained_tokens_per_s"] / sync["trained_tokens_per_s"])
    saved = json.loads(out.read_text())
    assert saved["bench"] == "agent-throughput" and "agent.tool_latency=lognormal" in saved["overrides"]
    assert saved["summary"]["whole_run_ratio"]["n"] == 1 and out.with_suffix(".png").stat().st_size > 0
    # read back from the run directories, the same figures (nothing re-run), and the file says so; the
    # run directories stored relative to the folder the bench ran in, reanalysed from another folder
    rows = [{**r, "run_dir": str(Path(r["run_dir"]).relative_to(tmp_path))} for r in saved["rows"]]
    out.write_text(json.dumps({**saved, "rows": rows}))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    again = reanalyse(str(out))
    for before, after in zip(result["rows"], again["rows"], strict=True):
        assert after["steady_state_tokens_per_s"] == pytest.approx(before["steady_state_tokens_per_s"])
        assert after["tool_wait_share"] == pytest.approx(before["tool_wait_share"])
    assert len(json.loads(out.read_text())["reanalysed"]) == 1
