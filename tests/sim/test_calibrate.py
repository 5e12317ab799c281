"""``python -m benchmarks profile``: the fits recover known costs; this machine's profile comes from the
committed measurements and matches the shipped one."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from asyncrl.sim.calibrate import fit_decode, fit_line, machine_profile
from asyncrl.sim.profile import load_profile
from tests.repo_paths import RESULTS


def test_fit_decode_recovers_the_cost_model() -> None:
    a, b, c = 0.001, 7e-5, 2e-7
    rows = []
    for ctx in (50, 600, 1200):
        for n in (1, 4, 16, 64, 128):
            steps = 149
            mean_ctx = ctx + (150 + 1) / 2
            rows.append(
                {
                    "context": ctx,
                    "running": n,
                    "new_tokens": 150,
                    "decode_tokens": steps * n,
                    "decode_s": steps * (a + b * n + c * n * mean_ctx),
                }
            )
    fa, fb, fc, worst = fit_decode(rows)
    assert (fa, fb, fc) == pytest.approx((a, b, c), rel=1e-6)
    assert worst < 1e-9


def test_fit_line() -> None:
    assert fit_line([(1000, 0.7), (2000, 1.2), (4000, 2.2)]) == pytest.approx((0.2, 0.0005))
    assert fit_line([(1000, 0.1), (2000, 0.3)])[0] == 0.0  # a negative intercept goes through the origin


def _assert_same_costs(fitted: Any, shipped: Any) -> None:
    """Field by field: integers, flags and names exactly; floats to 1e-9 relative. The float fields come from
    float64 least-squares fits whose last digits depend on the BLAS and the CPU's vector width (a fresh
    2-core machine gave a decode_base_s 1.3e-14 relative away from the shipped one); a changed fit, row or
    weighting moves them by far more than 1e-9."""
    assert type(fitted) is type(shipped)
    for f in dataclasses.fields(shipped):
        got, want = getattr(fitted, f.name), getattr(shipped, f.name)
        if isinstance(want, float) and not isinstance(want, bool):
            assert got == pytest.approx(want, rel=1e-9, abs=1e-15), f.name
        else:
            assert got == want, f.name


def test_this_machines_profile_from_the_committed_results() -> None:
    profile = machine_profile(RESULTS)
    shipped = load_profile("cpu-2core-tiny")
    for part in ("engine", "trainer", "sync"):
        _assert_same_costs(getattr(profile, part), getattr(shipped, part))
    assert 1e-4 < profile.trainer.per_token_s < 1e-3  # ~0.2 ms per trained token on one thread
    assert profile.engine.step_s(128, 128 * 1275) == pytest.approx(0.0385, rel=0.2)  # bench decode: 38.5 ms


def test_the_decode_scale_makes_the_simulation_of_a_run_decode_as_long_as_its_engine(tmp_path: Path) -> None:
    """A run whose engine decodes exactly twice as slowly as the sweep's fit (a simulated run, the slot
    layout on) gives a refined profile with the fit scaled by about 2 and the layout on (not exactly:
    the replay puts a group's samples into slots in the ledger's order, not the run's)."""
    from dataclasses import replace

    from asyncrl.config import dump_yaml, load_config
    from asyncrl.sim.calibrate import scale_decode
    from asyncrl.sim.run import simulate
    from asyncrl.sim.scenario import from_config

    swept = machine_profile(RESULTS)
    truth = replace(swept, engine=scale_decode(replace(swept.engine, slot_prefix_rows=True), 2.0))
    cfg = load_config(
        None,
        [
            "controller.max_staleness=2",
            "rollout.interrupt_mode=keep",
            "controller.batch_size=4",
            "rollout.group_size=4",
            "controller.total_steps=12",
            "controller.max_concurrent=16",
            "rollout.max_new_tokens=400",
            "rollout.max_slots=16",
        ],
    )
    run = tmp_path / "run"
    scenario = from_config(cfg, lengths="lognormal", length_median=60, prompt_len=20)
    simulate(scenario, truth, run_dir=run)
    dump_yaml(cfg, run / "config.yaml")
    refined = machine_profile(RESULTS, runs=[run])
    assert refined.engine.slot_prefix_rows and not swept.engine.slot_prefix_rows
    scale = refined.extra["decode_scale"]
    assert scale == pytest.approx(2.0, rel=0.1)
    assert refined.engine.decode_per_ctx_token_s == pytest.approx(scale * swept.engine.decode_per_ctx_token_s)
    assert "slot layout" in next(s.source for s in refined.sources if s.fields == "engine.decode_*")


def _run_with_steps(run: Path, steps: int) -> None:
    """A run directory whose trainer steps cost exactly 0.1 s + 1e-4 s per trained token."""
    import json

    run.mkdir()
    metrics = [
        {"step": i, "trained_tokens": 1000 * (i + 1), "train_step_s": 0.1 + 1e-4 * 1000 * (i + 1), "applied": True}
        for i in range(steps)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    rows = [
        {"prompt_id": "a", "sample_idx": i, "status": "trained", "start_version": 0, "response_len": 20 + i}
        for i in range(4)
    ]
    (run / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    line = {
        "engine_decode_s": 0.0,
        "engine_generated_tokens": 0,
        "engine_running": 0,
        "engine_prefill_s": 0.0,
        "engine_prefill_tokens": 0,
    }
    (run / "timeline.jsonl").write_text(json.dumps({"t": 0.0, **line}) + "\n" + json.dumps({"t": 1.0, **line}) + "\n")


def test_runs_with_enough_steps_give_the_trainer_fit_of_their_own_workload(tmp_path: Path) -> None:
    _run_with_steps(tmp_path / "many", 6)
    refined = machine_profile(RESULTS, runs=[tmp_path / "many"])
    assert (refined.trainer.base_s, refined.trainer.per_token_s) == pytest.approx((0.1, 1e-4), rel=1e-6)
    assert "the runs' workload only" in next(s.source for s in refined.sources if s.fields.startswith("trainer."))
    _run_with_steps(tmp_path / "few", 4)  # too few: the committed rows' fit stays
    kept = machine_profile(RESULTS, runs=[tmp_path / "few"])
    assert kept.trainer.per_token_s == pytest.approx(machine_profile(RESULTS).trainer.per_token_s, rel=0.2)
