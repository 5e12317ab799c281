"""``bench async`` bookkeeping: the over-seeds summary, the run variants, the workload names. No
runs here (those are the benchmark itself); the throughput measure is tested in tests/controller/test_throughput.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from asyncrl.config import load_config
from asyncrl.data.workloads import WARM_STARTS, WORKLOAD_ALIASES, WORKLOADS
from benchmarks.async_bench import _variants, summarize


def _row(eta: int, seed: int, eff: float, acc: float, hw: int = 2) -> dict:
    return {
        "workload": "task",
        "max_staleness": eta,
        "high_water_batches": hw,
        "seed": seed,
        "steady_state_tokens_per_s": eff,
        "trained_tokens_per_s": eff / 2,
        "accuracy_after": acc,
        "staleness_mean": eta / 2,
    }


def test_summary_means_spreads_and_paired_accuracy_deltas() -> None:
    rows = [_row(0, 0, 100.0, 0.60), _row(8, 0, 200.0, 0.55), _row(0, 1, 300.0, 0.70), _row(8, 1, 400.0, 0.71)]
    rows.append(_row(8, 0, 150.0, 0.50, hw=0))
    by = {(s["max_staleness"], s["high_water_batches"]): s for s in summarize(rows)}
    assert set(by) == {(0, 2), (8, 2), (8, 0)}
    eta8 = by[(8, 2)]
    assert eta8["seeds"] == [0, 1]
    assert eta8["steady_state_tokens_per_s_mean"] == pytest.approx(300.0)
    # ratios paired by seed: 200/100 and 400/300, mean and 95% t-interval (1 degree of freedom)
    ratio = eta8["steady_state_ratio_vs_sync"]
    assert eta8["steady_state_ratio_vs_sync_per_seed"] == pytest.approx([2.0, 4 / 3])
    assert ratio["mean"] == pytest.approx(5 / 3)
    assert ratio["high"] - ratio["mean"] == pytest.approx(12.706 * (2 - 4 / 3) / 2 / 2**0.5 * 2**0.5, rel=1e-3)
    assert eta8["whole_run_ratio_vs_sync"]["mean"] == pytest.approx(5 / 3)
    assert eta8["accuracy_after_mean"] == pytest.approx(0.63)
    # paired by seed: -5 and +1 points
    assert eta8["accuracy_delta_vs_sync_points_mean"] == pytest.approx(-2.0)
    assert eta8["accuracy_delta_vs_sync_points_std"] == pytest.approx(4.2426, abs=1e-3)
    assert by[(8, 0)]["accuracy_delta_vs_sync_points_mean"] == pytest.approx(-10.0)
    assert by[(0, 2)]["steady_state_ratio_vs_sync"]["mean"] == pytest.approx(1.0)


def test_variants_run_each_high_water_mark_for_asynchronous_rows_only() -> None:
    assert _variants((0, 8), None) == [(0, None), (8, None)]
    assert _variants((0, 4, 8), (2, 0)) == [(0, None), (4, 2), (4, 0), (8, 2), (8, 0)]


def test_workloads_are_valid_configs_and_long_is_long() -> None:
    assert set(WORKLOADS) == {"task", "long", "reason"} and WORKLOAD_ALIASES == {"a": "task", "b": "long"}
    reason = load_config(None, [*WORKLOADS["reason"], *WARM_STARTS["reason"]])
    assert reason.task.form == "repeat" and reason.rollout.max_new_tokens >= 2048
    task, long = (load_config(None, WORKLOADS[w]) for w in ("task", "long"))
    assert long.rollout.max_new_tokens >= 8 * task.rollout.max_new_tokens
    assert long.task.length_tail > task.task.length_tail and long.task.max_terms > task.task.max_terms
    # every generated group is trained in `long` (the synchronous run waits for its longest responses)
    assert not long.algo.filter_equal_rewards and task.algo.filter_equal_rewards
    # the controller as suits a generation-bound loop on a CPU; the task workload keeps the defaults
    assert (long.controller.high_water_unit, long.rollout.interrupt_mode) == ("samples", "keep")
    assert (task.controller.high_water_unit, task.rollout.interrupt_mode) == ("groups", "abort")


def test_long_workload_has_its_own_warm_start_on_its_own_problems() -> None:
    from asyncrl.launch.warm_start import warm_start_key

    assert set(WARM_STARTS) == set(WORKLOADS) and WARM_STARTS["task"] == []
    long_run, long_warm = load_config(None, WORKLOADS["long"]), load_config(None, WARM_STARTS["long"])
    # tuned on the very problems it is trained on (the held-out split's size aside)
    assert replace(long_warm.task, eval_size=0) == replace(long_run.task, eval_size=0)
    assert warm_start_key(long_warm) != warm_start_key(load_config(None, []))


def test_engine_alone_calibration_measures_after_every_queued_group_has_finished(tiny_policy_dir) -> None:
    import asyncio

    from benchmarks.async_bench import _engine_alone

    overrides = [
        f"model.path={tiny_policy_dir}",
        "controller.max_concurrent=3",
        "rollout.group_size=2",
        "rollout.max_new_tokens=12",
        "rollout.max_slots=4",
    ]
    out = asyncio.run(_engine_alone(overrides, seconds=0.3, max_fill_s=30.0))
    assert out["engine_alone_generated_tokens_per_s"] > 0
    assert 0 < out["engine_alone_fill_s"] < 30.0  # all three groups finished once, before the cap
    assert 0 < out["engine_alone_slot_utilisation"] <= 1


def test_user_overrides_win_over_the_workload(tiny_policy_dir) -> None:
    from benchmarks.async_bench import workload_overrides

    user = [f"model.path={tiny_policy_dir}", "task.eval_size=16", "rollout.interrupt_mode=abort"]
    cfg = load_config(None, workload_overrides(user, "long"))
    assert cfg.task.eval_size == 16 and cfg.rollout.interrupt_mode == "abort"  # the workload says 64, keep
    assert cfg.rollout.max_new_tokens == 2048 and str(cfg.model.path) == str(tiny_policy_dir)


def test_rows_carry_the_settings_that_identify_them(tiny_policy_dir) -> None:
    from benchmarks.async_bench import row_identity, workload_overrides

    run = [*workload_overrides([f"model.path={tiny_policy_dir}"], "long"), "controller.max_staleness=8"]
    assert row_identity("long", 3, run) == {
        "workload": "long",
        "max_staleness": 8,
        "high_water_batches": 2,
        "seed": 3,
        "high_water_unit": "samples",
        "interrupt_mode": "keep",
    }
