"""``bench ablation`` bookkeeping (the arms' overrides, the collapse flag, the t-interval summary) and
one tiny real grid (2 steps, tiny sizes): rows, summary and the controlled lag in each run's ledger."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from asyncrl.config import load_config
from asyncrl.controller.rundir import read_jsonl
from benchmarks.ablation import (
    OBJECTIVES,
    _curves,
    arm_overrides,
    collapse_reason,
    paired_differences,
    reanalyse,
    run_ablation,
    summarize,
    t_interval,
    t_quantile_975,
)


def test_every_objective_is_a_valid_config_at_every_lag() -> None:
    for name in OBJECTIVES:
        for lag in (0, 1, 16):
            cfg = load_config(None, arm_overrides(name, lag, 3e-4, 2, 5, []))
            assert cfg.controller.fixed_lag == lag <= cfg.controller.max_staleness
            assert not cfg.algo.filter_equal_rewards and cfg.trainer.lr == 3e-4 and cfg.run.seed == 2
    unc = load_config(None, arm_overrides("uncorrected", 4, 1e-4, 0, None, []))
    assert (unc.algo.loss_type, unc.algo.prox_mode, unc.algo.behav_cap) == ("pg", "behav", None)
    # the user's --set wins over the objective's keys
    m2 = load_config(None, arm_overrides("m2po", 1, 1e-4, 0, None, ["algo.m2_threshold=0.1"]))
    assert m2.algo.m2_threshold == 0.1
    with pytest.raises(ValueError, match="unknown objective"):
        arm_overrides("ppo2", 0, 1e-4, 0, None, [])


def test_bounded_staleness_is_ordinary_async_training_under_the_bound() -> None:
    cfg = load_config(None, arm_overrides("naive", 4, 1e-4, 1, 5, [], "bounded"))
    assert cfg.controller.fixed_lag is None and cfg.controller.max_staleness == 4
    assert cfg.algo.prox_mode == "behav" and not cfg.algo.filter_equal_rewards and cfg.run.seed == 1
    fixed = load_config(None, arm_overrides("naive", 4, 1e-4, 1, 5, []))
    assert fixed.controller.fixed_lag == 4  # the default stays the controlled lag
    with pytest.raises(ValueError, match="unknown staleness mode"):
        arm_overrides("naive", 4, 1e-4, 1, 5, [], "random")  # type: ignore[arg-type]


def test_t_interval() -> None:
    assert t_quantile_975(1) == 12.706 and t_quantile_975(30) == 2.042
    assert t_quantile_975(31) == pytest.approx(2.040, abs=2e-3)
    assert t_quantile_975(1000) == pytest.approx(1.962, abs=1e-3)
    values = [0.5, 0.6, 0.7]
    mean, half = t_interval(values)
    assert mean == pytest.approx(0.6) and half == pytest.approx(4.303 * statistics.stdev(values) / math.sqrt(3))
    assert math.isnan(t_interval([0.4])[1])


def test_collapse_flag() -> None:
    ok = [{"step": 0, "loss": 0.1, "skipped": 0.0}]
    assert collapse_reason(ok, 0.4, 0.5, 0.5) is None
    assert "accuracy" in collapse_reason(ok, 0.4, 0.19, 0.5)
    assert "non-finite" in collapse_reason([{"step": 3, "loss": None}], 0.4, 0.5, 0.5)
    assert "non-finite" in collapse_reason([{"step": 3, "loss": 0.1, "skipped": 1.0}], 0.4, 0.5, 0.5)
    assert collapse_reason(ok, 0.4, None, 0.5) == "no final accuracy"


def test_summary_over_seeds() -> None:
    def row(obj, seed, acc, collapsed=False):
        return {
            "objective": obj,
            "lag": 4,
            "lr": 1e-4,
            "seed": seed,
            "accuracy_before": 0.4,
            "accuracy_after": acc,
            "collapsed": collapsed,
            "behav_weight_mean": 1.0 + seed,
        }

    rows = [row("naive", 0, 0.5), row("naive", 1, 0.7, True), row("decoupled", 0, 0.6)]
    by = {s["objective"]: s for s in summarize(rows)}
    naive = by["naive"]
    assert naive["n"] == 2 and naive["accuracy_after_mean"] == pytest.approx(0.6)
    assert naive["accuracy_after_ci95_half"] == pytest.approx(12.706 * statistics.stdev([0.5, 0.7]) / math.sqrt(2))
    assert naive["collapse_rate"] == 0.5 and naive["behav_weight_mean"] == pytest.approx(1.5)
    assert by["decoupled"]["accuracy_after_ci95"] is None  # one seed: no interval


def _tiny_user(tiny_policy_dir) -> list[str]:
    """Tiny sizes for a real grid that runs in seconds."""
    return [
        f"model.path={tiny_policy_dir}",
        "controller.trainer_process=false",
        "controller.batch_size=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=12",
        "eval.max_new_tokens=12",
        "task.eval_size=4",
        "task.train_size=100",
        "eval.samples_per_prompt=1",
        "eval.report_greedy=false",
    ]


def test_tiny_grid_runs_with_the_controlled_lag(tiny_policy_dir, tmp_path) -> None:
    user = _tiny_user(tiny_policy_dir)
    out = run_ablation(
        str(tmp_path / "ablation.json"),
        overrides=user,
        objectives=("decoupled", "uncorrected"),
        lags=(1,),
        lrs=(1e-3,),
        seeds=(0,),
        steps=2,
        out_dir=str(tmp_path / "runs"),
    )
    assert (tmp_path / "ablation.json").is_file() and (tmp_path / "ablation.png").is_file()
    assert [(r["objective"], r["lag"], r["steps"]) for r in out["rows"]] == [("decoupled", 1, 2), ("uncorrected", 1, 2)]
    for r in out["rows"]:
        assert isinstance(r["collapsed"], bool) and "behav_weight_sq_mean" in r and "clip_frac" in r
        assert len(r["curves"]["reward"]) == 2 and len(r["curves"]["approx_kl_behav"]) == 2
        trained = [x for x in read_jsonl(f"{r['run_dir']}/trajectories.jsonl") if x["status"] == "trained"]
        assert {(x["trained_step"], x["min_version"], x["max_version"]) for x in trained} == {(0, 0, 0), (1, 0, 0)}
    assert len(out["summary"]) == 2 and out["summary"][0]["n"] == 1
    # an interrupted sweep resumed: the finished arms of the same config are read, the others run
    again = run_ablation(
        None,
        overrides=user,
        objectives=("decoupled", "naive"),
        lags=(1,),
        lrs=(1e-3,),
        seeds=(0,),
        steps=2,
        out_dir=str(tmp_path / "runs"),
        reuse=out["out_dir"],
    )
    first, second = again["rows"]
    assert first["reused"] and first["run_dir"] == out["rows"][0]["run_dir"]
    assert first["accuracy_after"] == out["rows"][0]["accuracy_after"]
    assert "reused" not in second and second["run_dir"].startswith(again["out_dir"])
    # a directory of the same name holding another arm's config is not reused
    from pathlib import Path

    from benchmarks.runs import reusable_run as _reusable

    decoupled_dir = Path(out["rows"][0]["run_dir"])
    assert _reusable(arm_overrides("decoupled", 1, 1e-3, 0, 2, user), decoupled_dir)
    assert not _reusable(arm_overrides("naive", 1, 1e-3, 0, 2, user), decoupled_dir)
    assert not _reusable(arm_overrides("decoupled", 1, 1e-3, 0, 3, user), decoupled_dir)
    assert not _reusable(arm_overrides("decoupled", 1, 1e-3, 0, 2, user, "bounded"), decoupled_dir)


def test_tiny_grid_under_bounded_staleness(tiny_policy_dir, tmp_path) -> None:
    user = _tiny_user(tiny_policy_dir)
    out = run_ablation(
        None,
        overrides=user,
        objectives=("naive",),
        lags=(2,),
        lrs=(1e-3,),
        seeds=(0,),
        steps=3,
        out_dir=str(tmp_path / "runs"),
        staleness="bounded",
    )
    (row,) = out["rows"]
    assert out["staleness"] == "bounded" and "/bounded-s0-" in row["run_dir"] and row["steps"] == 3
    trained = [x for x in read_jsonl(f"{row['run_dir']}/trajectories.jsonl") if x["status"] == "trained"]
    assert trained and all(x["trained_step"] - x["min_version"] <= 2 for x in trained)
    assert row["max_staleness_seen"] <= 2


def test_paired_differences_are_seed_by_seed_against_decoupled() -> None:
    def row(obj, seed, acc):
        return {"objective": obj, "lag": 8, "lr": 2e-4, "seed": seed, "accuracy_after": acc}

    rows = [
        row("decoupled", 0, 0.5),
        row("decoupled", 1, 0.7),
        row("decoupled", 2, 0.6),
        row("naive", 0, 0.6),
        row("naive", 1, 0.75),
        row("naive", 2, None),  # seed 2 has no accuracy
        row("uncorrected", 5, 0.1),  # no decoupled run at seed 5: no pair
    ]
    (naive,) = paired_differences(rows)
    assert naive["objective"] == "naive" and naive["reference"] == "decoupled" and naive["n"] == 2
    assert naive["minus_reference_per_seed"] == pytest.approx([0.1, 0.05])
    half = 12.706 * statistics.stdev([0.1, 0.05]) / math.sqrt(2)
    assert naive["minus_reference_ci95"] == pytest.approx([0.075 - half, 0.075 + half])


def test_curves_keep_every_step_and_skip_absent_keys() -> None:
    curves = _curves([{"reward": 0.25, "clip_frac": 0.1}, {"reward": 0.5}])
    assert curves == {"reward": [0.25, 0.5], "clip_frac": [0.1, None]}


def test_reanalyse_recomputes_from_the_run_directories(tmp_path) -> None:
    rows = []
    for seed, acc in ((0, 0.4), (1, 0.6)):
        run_dir = tmp_path / f"run{seed}"
        run_dir.mkdir()
        lines = [{"step": i, "reward": 0.1 * i, "approx_kl_behav": 0.01 * (seed + 1)} for i in range(3)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
        rows.append(
            {
                "objective": "naive",
                "lag": 2,
                "lr": 1e-4,
                "seed": seed,
                "accuracy_before": 0.3,
                "accuracy_after": acc,
                "collapsed": False,
                "run_dir": str(run_dir),
            }
        )
    rows.append({**rows[0], "run_dir": str(tmp_path / "gone"), "seed": 2, "approx_kl_behav": 0.5})  # kept as written
    path = tmp_path / "ablation.json"
    path.write_text(json.dumps({"bench": "ablation", "lrs": [1e-4], "rows": rows}))
    out = reanalyse(str(path))
    assert json.loads(path.read_text())["reanalysed"] and (tmp_path / "ablation.png").is_file()
    assert out["rows"][1]["curves"]["reward"] == [0.0, 0.1, 0.2] and out["rows"][1]["approx_kl_behav"] == 0.02
    assert "curves" not in out["rows"][2] and out["rows"][2]["approx_kl_behav"] == 0.5
    (cell,) = out["summary"]
    assert cell["n"] == 3 and cell["approx_kl_behav"] == pytest.approx((0.01 + 0.02 + 0.5) / 3)


def test_reanalyse_finds_relative_run_directories_from_another_folder(tmp_path, monkeypatch) -> None:
    """Run directories stored relative to where the bench ran (the repository root), the JSON in
    ``docs/results``, reanalysed from another folder: the rows are read again, not kept as written."""
    repo = tmp_path / "repo"
    (repo / "runs" / "run0").mkdir(parents=True)
    lines = [{"step": i, "reward": 0.1 * i, "approx_kl_behav": 0.03} for i in range(3)]
    (repo / "runs" / "run0" / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    row = {
        "objective": "naive",
        "lag": 2,
        "lr": 1e-4,
        "seed": 0,
        "accuracy_before": 0.3,
        "accuracy_after": 0.4,
        "collapsed": False,
        "run_dir": "runs/run0",
    }
    path = repo / "docs" / "results" / "ablation.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"bench": "ablation", "lrs": [1e-4], "rows": [row]}))
    monkeypatch.chdir(tmp_path)
    out = reanalyse(str(path))
    assert out["rows"][0]["curves"]["reward"] == [0.0, 0.1, 0.2] and out["rows"][0]["approx_kl_behav"] == 0.03
