"""A simulated run directory reads like a real one: the throughput of ``controller.throughput`` computed
from its files matches the simulator's figure, and ``asyncrl report`` plots it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from asyncrl.controller.rundir import read_jsonl
from asyncrl.controller.throughput import measure_throughput
from asyncrl.sim.run import simulate
from asyncrl.sim.scenario import Scenario

SC = Scenario(
    profile="cpu-2core-tiny",
    batch_size=4,
    group_size=4,
    max_concurrent=16,
    total_steps=10,
    length_median=80,
    prompt_len=30,
    max_staleness=2,
)


def test_the_run_directory_has_the_real_schema(tmp_path: Path) -> None:
    sim = simulate(SC, run_dir=tmp_path / "sim")
    run = tmp_path / "sim"
    metrics, ledger, timeline = (read_jsonl(run / f) for f in ("metrics.jsonl", "trajectories.jsonl", "timeline.jsonl"))
    assert len(metrics) == SC.total_steps and timeline and ledger
    real_keys = {
        "t",
        "engine_running",
        "engine_waiting",
        "engine_generated_tokens",
        "engine_decode_s",
        "engine_prefill_s",
        "engine_update_s",
        "engine_prefill_tokens",
        "trainer_busy",
        "checkpointing",
        "reward_in_flight",
        "buffer_groups",
        "running_groups",
        "generating_samples",
        "version",
    }
    assert real_keys <= set(timeline[0])
    thr = measure_throughput(metrics, ledger, timeline, warmup_s=sim.result.window_start_s)
    assert thr.steady_state_tokens_per_s == pytest.approx(sim.result.steady_state_tokens_per_s, rel=1e-9)
    assert thr.whole_run_tokens_per_s == pytest.approx(sim.result.whole_run_tokens_per_s, rel=1e-9)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["simulated"] and summary["steps"] == SC.total_steps


def test_asyncrl_report_plots_a_simulated_run(tmp_path: Path) -> None:
    from asyncrl.controller.report import make_report

    simulate(replace(SC, total_steps=6), run_dir=tmp_path / "sim")
    written = make_report(tmp_path / "sim")
    assert {p.name for p in written} == {"reward.png", "throughput.png", "staleness.png", "timeline.png"}


def test_a_large_run_keeps_no_ledger_and_a_bounded_timeline(tmp_path: Path) -> None:
    sim = simulate(replace(SC, ledger_rows=10, timeline_lines=50, total_steps=30), run_dir=tmp_path / "big")
    assert sim.raw["ledger"] is None
    assert (tmp_path / "big" / "trajectories.jsonl").read_text() == ""
    assert len(sim.raw["timeline"]) <= 60
