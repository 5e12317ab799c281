"""``python -m benchmarks objectives``: its plan, step-size choice and paired tables on fake runs (no training).

``run_arm`` is replaced by a fake whose final accuracy is a known function of (objective, step size, lag, seed),
so the tuning choice, the comparison cells and the paired differences can be checked against hand values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import objectives as bench
from benchmarks.__main__ import build_parser, main
from benchmarks.objectives import Cell, Plan

PLAN = Plan(
    objectives=("decoupled", "naive", "prox_clip"),
    lrs=(5e-5, 1e-4, 2e-4),
    shared_lr=1e-4,
    lags=(2, 8),
    etas=(4,),
    seeds=(0, 1, 2),
    tune_seeds=(0, 1),
    tune_lag=0,
    steps=3,
)

BEST = {"decoupled": 1e-4, "naive": 2e-4, "prox_clip": 5e-5}


def _accuracy(objective: str, lr: float, lag: int, seed: int) -> float:
    """The fake's final accuracy: each objective peaks at its ``BEST`` step size; staleness costs decoupled more."""
    peak = 0.6 - 1000 * abs(lr - BEST[objective])
    cost = {"decoupled": 0.02, "naive": 0.01, "prox_clip": 0.015}[objective] * lag
    return peak - cost + 0.01 * seed


def test_tuning_cells_cover_the_grid_at_the_tuning_lag() -> None:
    cells = bench.tune_cells(PLAN)
    assert len(cells) == 3 * 3 * 2 and len(set(cells)) == len(cells)
    assert {(c.staleness, c.lag) for c in cells} == {("fixed", 0)}
    assert [c.seed for c in cells[:9]] == [0] * 9  # seed-major


def test_comparison_cells_share_a_run_where_the_rules_agree() -> None:
    tuned = set(bench.tune_cells(PLAN))
    cells = bench.compare_cells(PLAN, BEST, tuned)
    # decoupled's best is the shared step size: one run per condition; the others two
    per_seed_condition = 1 + 2 + 2
    assert len(cells) == len(PLAN.seeds) * 3 * per_seed_condition + per_seed_condition  # lag 0: seed 2 only
    assert Cell("naive", "bounded", 4, 2e-4, 1) in cells and Cell("naive", "bounded", 4, 1e-4, 1) in cells
    assert {c.seed for c in cells if c.lag == 0} == {2}  # seeds 0-1 ran there while tuning
    assert not tuned & set(cells)
    off_grid = Plan(**{**PLAN.__dict__, "shared_lr": 3e-4})
    extra = [c for c in bench.compare_cells(off_grid, BEST, tuned) if c.lag == 0 and c.seed < 2]
    assert len(extra) == 3 * 2 and {c.lr for c in extra} == {3e-4}
    assert bench.compare_cells(PLAN, BEST, tuned | set(cells[:4])) == cells[4:]


def test_best_step_size_is_the_highest_mean_and_ties_go_to_the_smaller() -> None:
    table = [
        {"objective": "a", "lr": 1e-4, "accuracy_after_mean": 0.5},
        {"objective": "a", "lr": 2e-4, "accuracy_after_mean": 0.7},
        {"objective": "b", "lr": 1e-4, "accuracy_after_mean": 0.6},
        {"objective": "b", "lr": 5e-5, "accuracy_after_mean": 0.6},
        {"objective": "b", "lr": 2e-4, "accuracy_after_mean": None},
    ]
    assert bench.best_lrs(table) == {"a": 2e-4, "b": 5e-5}
    with pytest.raises(ValueError, match="no finished tuning run for c"):
        bench.best_lrs([{"objective": "c", "lr": 1e-4, "accuracy_after_mean": None}])


def test_the_cost_is_printed_from_the_plan() -> None:
    line = bench.budget_line(PLAN)
    n_tune, n_compare = 18, (len(PLAN.seeds) * 3 + 1) * 3 * 2  # the bound: every best off the shared step size
    assert f"{n_tune} tuning runs + at most {n_compare} comparison runs" in line
    hours = bench.estimate_seconds(n_tune + n_compare, 3) / 3600
    assert f"about {hours:.1f} h" in line
    busy = bench.estimate_seconds(n_tune + n_compare, 3, bench.LOADED_COST) / 3600
    assert f"on a busy box (load ~9) about {busy:.1f} h" in line
    assert "busy" not in bench.budget_line(bench.SHORT)
    assert bench.estimate_seconds(2, 10) == pytest.approx(2 * (bench.SECONDS_PER_RUN + 10 * bench.SECONDS_PER_STEP))


def test_whole_bench_on_fake_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    seen: list[str] = []

    def fake_run_arm(overrides: list[str], run_dir: Path, collapse_fraction: float, reuse: Any) -> dict[str, Any]:
        calls.append(overrides)
        cell = next(c for c in [*bench.tune_cells(PLAN), *bench.compare_cells(PLAN, BEST)] if c.name == run_dir.name)
        assert run_dir.name not in {Path(d).name for d in seen}
        seen.append(str(run_dir))
        return {
            "accuracy_before": 0.3,
            "accuracy_after": _accuracy(cell.objective, cell.lr, cell.lag, cell.seed),
            "collapsed": False,
            "applied_weight_sq_mean": 1.5,
            "behav_weight_sq_mean": 9.0,
            "wall_s": 1.0,
            "curves": {"reward": [0.1], "clip_frac": [0.2]},
        }

    monkeypatch.setattr(bench, "run_arm", fake_run_arm)
    out = tmp_path / "objectives.json"
    payload = bench.run_objectives(str(out), PLAN, out_dir=str(tmp_path / "runs"))
    assert payload["best_lrs"] == BEST
    tuned = set(bench.tune_cells(PLAN))
    assert len(payload["rows"]) == 18 + len(bench.compare_cells(PLAN, BEST, tuned)) == len(calls)
    bounded = [c for c in calls if "controller.fixed_lag=null" in c]
    assert bounded and all("controller.high_water_batches=0" in c for c in bounded)
    assert all("trainer.ppo_minibatches=4" in c for c in calls)
    row = payload["rows"][0]
    assert {"objective", "staleness", "lag", "lr", "seed", "phase", "accuracy_before", "accuracy_after"} <= set(row)
    assert row["curves"] == {"reward": [0.1]}
    by = {(p["lr_rule"], p["staleness"], p["lag"], p["objective"]): p for p in payload["paired"]}
    own = by[("own", "fixed", 8, "naive")]  # each at its best: the peaks cancel, the lag costs differ
    assert own["minus_reference_mean"] == pytest.approx((0.02 - 0.01) * 8)
    assert own["minus_reference_per_seed"] == pytest.approx([0.08] * 3) and own["excludes_zero"] is True
    shared = by[("shared", "bounded", 4, "prox_clip")]  # both at 1e-4: prox_clip is 0.05 off its peak
    assert shared["minus_reference_mean"] == pytest.approx(-1000 * 5e-5 + (0.02 - 0.015) * 4)
    assert shared["lr"] == shared["reference_lr"] == 1e-4
    cmp = {(c["lr_rule"], c["staleness"], c["lag"], c["objective"]): c for c in payload["comparison"]}
    assert cmp[("own", "fixed", 0, "naive")]["n"] == 3  # lag 0: the tuning seeds and seed 2
    assert len(payload["comparison"]) == 2 * 4 * 3  # rules x conditions (lag 0, 2, 8, eta 4) x objectives
    assert cmp[("own", "fixed", 2, "naive")]["applied_weight_sq_mean"] == pytest.approx(1.5)
    written = json.loads(out.read_text())
    assert written["paired"] == payload["paired"] and len(written["rows"]) == len(payload["rows"])


def test_options_and_their_errors(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser("objectives").parse_args(["--short", "--lags", "2,4", "--etas", ""])
    plan = bench.plan_from_args(args, config_lr=1e-4)
    assert plan.lags == (2, 4) and plan.etas == () and plan.seeds == (0, 1) and plan.shared_lr == bench.SHORT.shared_lr
    full = bench.plan_from_args(build_parser("objectives").parse_args([]), config_lr=1e-4)
    assert full == bench.DEFAULTS
    assert len(full.lrs) >= 4 and min(full.lrs) == 2.5e-5 and max(full.lrs) == 2e-4
    assert full.steps >= 150 and len(full.seeds) >= 5 and full.lags == (2, 4, 8) and full.etas == (4, 8)
    assert main(["objectives", "--plan-only", "--short"]) == 0
    assert "tuning runs" in capsys.readouterr().out
    assert main(["objectives", "--plan-only", "--objectives", "naive,bogus"]) == 2
    assert "unknown objective(s) ['bogus']" in capsys.readouterr().err
    assert main(["objectives", "--plan-only", "--lrs", "0,1e-4"]) == 2
    assert main(["objectives", "--tables-only"]) == 2
    assert "--tables-only needs --rows-from" in capsys.readouterr().err


def test_tune_once_tunes_the_reference_and_shares_its_step_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    once = Plan(**{**PLAN.__dict__, "tune_once": True})
    assert {c.objective for c in bench.tune_cells(once)} == {"decoupled"} and len(bench.tune_cells(once)) == 3 * 2

    def fake_run_arm(overrides: list[str], run_dir: Path, collapse_fraction: float, reuse: Any) -> dict[str, Any]:
        lr = next(float(o.split("=")[1]) for o in overrides if o.startswith("trainer.lr="))
        return {
            "accuracy_before": 0.3,
            "accuracy_after": 0.6 - 1000 * abs(lr - 2e-4),
            "collapsed": False,
            "wall_s": 1.0,
        }

    monkeypatch.setattr(bench, "run_arm", fake_run_arm)
    payload = bench.run_objectives(None, once, out_dir=str(tmp_path / "runs"))
    assert payload["best_lrs"] == dict.fromkeys(once.objectives, 2e-4)
    assert {t["objective"] for t in payload["tuning"]} == {"decoupled"}
    at_tuning_lag = [c for c in bench.compare_cells(once, payload["best_lrs"]) if c.lag == once.tune_lag]
    assert at_tuning_lag and {c.objective for c in at_tuning_lag if c.staleness == "fixed"} == {"decoupled"}
    assert {c.objective for c in bench.compare_cells(PLAN, BEST) if c.lag == PLAN.tune_lag} == set(PLAN.objectives)
    args = build_parser("objectives").parse_args(["--tune-once", "--tune-lag", "2"])
    with pytest.raises(bench.ConfigError, match="--tune-once needs --tune-lag 0"):
        bench.plan_from_args(args, config_lr=1e-4)


def _fake_runs(calls: list[str], stop_after: int | None = None) -> Any:
    """A ``run_arm`` whose accuracy is ``_accuracy`` of the run's cell; it raises KeyboardInterrupt (a stopped
    invocation) once ``stop_after`` runs are made."""

    def fake_run_arm(overrides: list[str], run_dir: Path, collapse_fraction: float, reuse: Any) -> dict[str, Any]:
        if stop_after is not None and len(calls) == stop_after:
            raise KeyboardInterrupt
        calls.append(run_dir.name)
        cell = next(c for c in [*bench.tune_cells(PLAN), *bench.compare_cells(PLAN, BEST)] if c.name == run_dir.name)
        return {
            "accuracy_before": 0.3,
            "accuracy_after": _accuracy(cell.objective, cell.lr, cell.lag, cell.seed),
            "collapsed": False,
            "wall_s": 1.0,
        }

    return fake_run_arm


def test_a_stopped_invocation_continues_from_its_progress_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first: list[str] = []
    monkeypatch.setattr(bench, "run_arm", _fake_runs(first, stop_after=25))
    result = tmp_path / "objectives.json"
    with pytest.raises(KeyboardInterrupt):
        bench.run_objectives(str(result), PLAN, out_dir=str(tmp_path / "runs"))
    progress = bench.progress_path(str(result), tmp_path)
    assert progress == tmp_path / "objectives.progress.json" and not result.exists()
    kept = json.loads(progress.read_text())
    assert len(kept["rows"]) == len(first) == 25  # every run made before the stop, none after
    assert kept["overrides"] == bench.BASE_OVERRIDES and kept["plan"]["steps"] == PLAN.steps

    with pytest.raises(bench.ConfigError, match="holds the rows of an earlier invocation: continue with --rows-from"):
        bench.run_objectives(str(result), PLAN, out_dir=str(tmp_path / "runs"))  # would replace the 25 rows
    assert len(json.loads(progress.read_text())["rows"]) == 25
    second: list[str] = []
    monkeypatch.setattr(bench, "run_arm", _fake_runs(second))
    payload = bench.run_objectives(str(result), PLAN, out_dir=str(tmp_path / "runs"), rows_files=[str(progress)])
    assert not set(first) & set(second)  # nothing made twice
    everything: list[str] = []
    monkeypatch.setattr(bench, "run_arm", _fake_runs(everything))
    whole = bench.run_objectives(None, PLAN, out_dir=str(tmp_path / "runs-whole"))
    assert sorted(first + second) == sorted(everything)
    assert payload["best_lrs"] == whole["best_lrs"] == BEST
    assert payload["paired"] == whole["paired"]
    assert sum(bool(r.get("from_rows_file")) for r in payload["rows"]) == 25
    assert result.exists() and not progress.exists()  # the result file holds every row
    assert payload["rows_unused"] == [] and payload["wall_s_total"] == pytest.approx(len(second))


def test_tables_only_analyses_the_rows_so_far_and_runs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []
    monkeypatch.setattr(bench, "run_arm", _fake_runs(made, stop_after=40))
    with pytest.raises(KeyboardInterrupt):
        bench.run_objectives(str(tmp_path / "objectives.json"), PLAN, out_dir=str(tmp_path / "runs"))
    progress = str(bench.progress_path(str(tmp_path / "objectives.json"), tmp_path))
    n_cells = len(bench.tune_cells(PLAN)) + len(bench.compare_cells(PLAN, BEST, set(bench.tune_cells(PLAN))))
    made.clear()
    tables = tmp_path / "tables.json"
    payload = bench.run_objectives(
        str(tables), PLAN, out_dir=str(tmp_path / "none"), rows_files=[progress], tables_only=True
    )
    assert made == [] and not (tmp_path / "none").exists() and Path(progress).exists()  # nothing run or removed
    assert len(payload["missing_cells"]) == n_cells - 40 and payload["best_lrs"] == BEST
    missing = {bench.Cell(**c) for c in payload["missing_cells"]}
    assert not missing & {bench.Cell(*(r[k] for k in bench.ROW_CELL_KEYS)) for r in payload["rows"]}
    assert json.loads(tables.read_text())["paired"] == payload["paired"] and payload["paired"]
    few = tmp_path / "few.progress.json"
    kept = json.loads(Path(progress).read_text())
    few.write_text(json.dumps({**kept, "rows": kept["rows"][:2]}))  # the tuning not finished
    with pytest.raises(bench.ConfigError, match="no finished tuning run for"):
        bench.run_objectives(None, PLAN, out_dir=str(tmp_path / "none"), rows_files=[str(few)], tables_only=True)


def test_rows_are_taken_only_from_the_same_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    made: list[str] = []
    monkeypatch.setattr(bench, "run_arm", _fake_runs(made, stop_after=3))
    result = tmp_path / "objectives.json"
    with pytest.raises(KeyboardInterrupt):
        bench.run_objectives(str(result), PLAN, out_dir=str(tmp_path / "runs"))
    progress = str(bench.progress_path(str(result), tmp_path))
    kept = json.loads(Path(progress).read_text())
    stopped = {**kept["rows"][0], "accuracy_after": None}  # a run stopped before its last evaluation
    Path(progress).write_text(json.dumps({**kept, "rows": [stopped, *kept["rows"][1:]]}))
    assert len(bench.rows_from([progress], PLAN, list(bench.BASE_OVERRIDES))) == 2  # it is made again
    Path(progress).write_text(json.dumps(kept))
    wider = Plan(**{**PLAN.__dict__, "seeds": (0, 1, 2, 3), "tune_seeds": (0, 1, 2), "lrs": (2.5e-5, *PLAN.lrs)})
    assert len(bench.rows_from([progress], wider, list(bench.BASE_OVERRIDES))) == 3  # seeds and a wider grid
    other = Plan(**{**PLAN.__dict__, "steps": 150})
    with pytest.raises(bench.ConfigError, match="its plan has steps=3 where this one has 150"):
        bench.rows_from([progress], other, list(bench.BASE_OVERRIDES))
    with pytest.raises(bench.ConfigError, match="its runs were made with"):
        bench.rows_from([progress], PLAN, [*bench.BASE_OVERRIDES, "trainer.lr=1e-3"])
    with pytest.raises(bench.ConfigError, match="not an objectives result or progress file"):
        bench.rows_from([str(tmp_path / "missing.json")], PLAN, list(bench.BASE_OVERRIDES))
    (tmp_path / "other.json").write_text(json.dumps({"bench": "ablation", "plan": {}, "rows": []}))
    with pytest.raises(bench.ConfigError, match="its bench is 'ablation'"):
        bench.rows_from([str(tmp_path / "other.json")], PLAN, list(bench.BASE_OVERRIDES))
    (tmp_path / "rowless.json").write_text(json.dumps({"bench": "objectives", "plan": {}, "rows": [{"seed": 0}]}))
    with pytest.raises(bench.ConfigError, match="not an objectives result or progress file"):
        bench.rows_from([str(tmp_path / "rowless.json")], PLAN, list(bench.BASE_OVERRIDES))
    missing = str(tmp_path / "missing.json")
    assert main(["objectives", "--short", "--rows-from", missing, "--out", str(tmp_path)]) == 2
    assert f"--rows-from {missing}: not an objectives result" in capsys.readouterr().err


def test_rows_of_seeds_left_out_stay_in_the_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A continuation with fewer seeds takes the rows it needs; the others go to ``rows_unused``, so removing the
    progress file loses none."""
    made: list[str] = []
    monkeypatch.setattr(bench, "run_arm", _fake_runs(made, stop_after=55))  # tuning 18, seeds 0-1 30, seed 2 7
    result = tmp_path / "objectives.json"
    with pytest.raises(KeyboardInterrupt):
        bench.run_objectives(str(result), PLAN, out_dir=str(tmp_path / "runs"))
    progress = bench.progress_path(str(result), tmp_path)
    fewer = Plan(**{**PLAN.__dict__, "seeds": (0, 1)})
    monkeypatch.setattr(bench, "run_arm", _fake_runs([]))
    payload = bench.run_objectives(str(result), fewer, out_dir=str(tmp_path / "runs"), rows_files=[str(progress)])
    kept = {(r["objective"], r["staleness"], r["lag"], r["lr"], r["seed"]) for r in payload["rows"]}
    unused = {(r["objective"], r["staleness"], r["lag"], r["lr"], r["seed"]) for r in payload["rows_unused"]}
    assert not kept & unused and len(kept | unused) >= 55 and {seed for *_, seed in unused} == {2}
    assert not progress.exists()
