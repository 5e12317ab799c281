"""``bench headline``'s arithmetic: targets from the synchronous run, times to target, speed-ups
paired by seed, final accuracies, throughput ratios (no training runs here)."""

from __future__ import annotations

import json
import math

import pytest

from asyncrl.config import ConfigError, load_config
from benchmarks import runs as run_files
from benchmarks.headline import SYNC_CANDIDATES, analyse, reanalyse


def _row(seed: int, eta: int, curve: list[tuple[float, float]], steady: float, whole: float) -> dict:
    return {
        "seed": seed,
        "max_staleness": eta,
        "curve": curve,
        "steady_state_tokens_per_s": steady,
        "trained_tokens_per_s": whole,
        "staleness_mean": eta / 2,
    }


def test_speedup_is_paired_by_seed_against_the_synchronous_target() -> None:
    rows = [
        # seed 0: sync goes 0.2 -> 0.8 over 100 s; target 0.2 + 0.9 * 0.6 = 0.74, reached at t = 90
        _row(0, 0, [(0, 0.2), (50, 0.5), (80, 0.7), (90, 0.74), (100, 0.8)], 100.0, 90.0),
        _row(0, 8, [(0, 0.2), (20, 0.6), (30, 0.8), (45, 0.82)], 250.0, 200.0),
        # seed 1: sync 0.3 -> 0.7; target 0.66; the async arm never holds it
        _row(1, 0, [(0, 0.3), (60, 0.66), (120, 0.7)], 110.0, 100.0),
        _row(1, 8, [(0, 0.3), (30, 0.7), (60, 0.5)], 220.0, 180.0),
    ]
    result = analyse(rows, target_fraction=0.9)
    seed0, seed1 = result["per_seed"]
    assert seed0["target_accuracy"] == pytest.approx(0.74)
    assert seed0["eta0_time_to_target_s"] == pytest.approx(90.0)
    assert seed0["eta8_time_to_target_s"] == pytest.approx(20 + 10 * (0.74 - 0.6) / 0.2)
    assert seed0["eta8_speedup"] == pytest.approx(90.0 / 27.0)
    assert seed0["eta8_final_minus_sync_points"] == pytest.approx(2.0)
    assert seed0["eta8_steady_state_tokens_per_s_ratio"] == pytest.approx(2.5)
    assert seed1["eta8_time_to_target_s"] == math.inf and seed1["eta8_speedup"] == 0.0  # never reached: no speed-up
    # by the first crossing, held or not, seed 1's async arm reached 0.66 at t = 30 * 0.36 / 0.4
    assert seed1["eta8_first_crossing_s"] == pytest.approx(30 * 0.36 / 0.4)
    assert seed1["eta8_speedup_first_crossing"] == pytest.approx(60.0 / 27.0)
    assert result["summary"]["eta8"]["reached_first_crossing"] == "2 of 2"
    summary = result["summary"]["eta8"]
    assert summary["speedup"]["mean"] == pytest.approx((90.0 / 27.0 + 0.0) / 2)
    assert summary["speedup"]["n"] == 2 and summary["speedup"]["low"] < summary["speedup"]["mean"]
    assert summary["final_minus_sync_points"]["mean"] == pytest.approx((2.0 - 20.0) / 2)
    assert result["summary"]["eta0"]["speedup"]["mean"] == pytest.approx(1.0)


def test_synchronous_candidates_are_valid_configs() -> None:
    for overrides in SYNC_CANDIDATES.values():
        cfg = load_config(None, [*overrides, "controller.max_staleness=0"])
        assert cfg.controller.max_staleness == 0 and cfg.run.torch_threads in (1, 2)


def test_a_plateau_target_averages_the_synchronous_runs_last_evaluations() -> None:
    # the synchronous run peaks at 0.8 and ends at 0.6: the last-evaluation rule sets the target at
    # 0.6, the plateau rule (mean of the last three, 0.7) higher; every arm's final is its own plateau
    rows = [
        _row(0, 0, [(0, 0.2), (50, 0.5), (100, 0.8), (150, 0.7), (200, 0.6)], 100.0, 100.0),
        _row(0, 4, [(0, 0.2), (40, 0.6), (80, 0.7), (120, 0.7)], 150.0, 150.0),
    ]
    last = analyse(rows, target_fraction=1.0)["per_seed"][0]
    assert last["target_accuracy"] == pytest.approx(0.6)
    assert last["eta0_time_to_target_s"] == pytest.approx(50 + 50 * 0.1 / 0.3)
    plateau = analyse(rows, target_fraction=1.0, eval_samples=100, final_window=3)["per_seed"][0]
    assert plateau["sync_final"] == pytest.approx(0.7) and plateau["target_accuracy"] == pytest.approx(0.7)
    assert plateau["eta0_time_to_target_s"] == pytest.approx(50 + 50 * 0.2 / 0.3)
    assert plateau["eta4_time_to_target_s"] == pytest.approx(80.0)
    assert plateau["eta4_final_minus_sync_points"] == pytest.approx(100 * ((0.6 + 0.7 + 0.7) / 3 - 0.7))
    # three evaluations of 100 samples behind the final: a smaller standard error than one
    assert plateau["sync_gain_se"] == pytest.approx(math.sqrt(0.2 * 0.8 / 100 + 0.7 * 0.3 / 300))
    with pytest.raises(ValueError, match="final_window"):
        analyse(rows, target_fraction=1.0, final_window=0)


def test_reanalyse_names_a_run_directory_it_cannot_find(tmp_path, monkeypatch) -> None:
    path = tmp_path / "results" / "headline.json"
    path.parent.mkdir()
    row = {**_row(0, 0, [(0, 0.2), (10, 0.5)], 1.0, 1.0), "run_dir": "runs/bench-headline/s0-eta0"}
    path.write_text(json.dumps({"bench": "headline", "warmup_s": 0.0, "target_fraction": 0.9, "rows": [row]}))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="run directory runs/bench-headline/s0-eta0 .* not found"):
        reanalyse(str(path))


def test_rows_of_seeds_without_a_synchronous_run_carry_this_analysis_figures() -> None:
    stale = {"final_accuracy": 0.123, "time_to_target_s": 7.0}  # what a source file's row may still hold
    rows = [{**_row(0, 4, [(0, 0.2), (40, 0.6)], 150.0, 150.0), **stale}]
    result = analyse(rows, target_fraction=0.9)
    assert result["per_seed"] == [] and rows[0]["time_to_target_s"] is None
    assert result["summary"]["eta4"]["final_accuracy"]["mean"] == pytest.approx(0.6)


def test_a_synchronous_run_that_never_holds_its_own_target_gives_no_speedup() -> None:
    # plateau of the last three (0.8, 0.4, 0.4) = 0.533: the synchronous run never holds it after its peak
    rows = [
        _row(0, 0, [(0, 0.2), (50, 0.3), (100, 0.8), (150, 0.4), (200, 0.4)], 100.0, 100.0),
        _row(0, 4, [(0, 0.2), (40, 0.6), (80, 0.7)], 150.0, 150.0),
        _row(1, 0, [(0, 0.2), (50, 0.5), (100, 0.6)], 100.0, 100.0),
        _row(1, 4, [(0, 0.2), (25, 0.6), (50, 0.6)], 150.0, 150.0),
    ]
    result = analyse(rows, target_fraction=1.0, final_window=3)
    seed0, seed1 = result["per_seed"]
    assert not seed0["sync_holds_target"] and "eta4_speedup" not in seed0 and seed0["eta4_reached"]
    summary = result["summary"]["eta4"]
    assert summary["speedup"]["n"] == 1 and math.isfinite(summary["speedup"]["mean"])
    assert summary["seeds_without_synchronous_time"] == [0] and seed1["sync_holds_target"]


def test_accuracy_at_equal_wall_time_compares_both_runs_when_the_shorter_ended() -> None:
    from benchmarks.stats import accuracy_at

    sync = [(0.0, 0.2), (100.0, 0.4), (200.0, 0.6)]
    assert accuracy_at(sync, 50.0) == pytest.approx(0.3) and accuracy_at(sync, 200.0) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="outside"):
        accuracy_at(sync, 250.0)
    rows = [_row(0, 0, sync, 100.0, 100.0), _row(0, 4, [(0.0, 0.2), (60.0, 0.5), (120.0, 0.55)], 150.0, 150.0)]
    seed = analyse(rows, target_fraction=0.9)["per_seed"][0]
    # the asynchronous run ended at 120 s (its step budget): there the synchronous one was at 0.44
    assert seed["eta4_common_end_s"] == pytest.approx(120.0)
    assert seed["eta4_at_common_end_minus_sync_points"] == pytest.approx(100 * (0.55 - 0.44))
    assert seed["eta4_final_minus_sync_points"] == pytest.approx(100 * (0.55 - 0.6))


def test_a_time_budget_reaches_every_arm_and_snapshots_are_scored_apart(tmp_path, monkeypatch, capsys) -> None:
    """``time_budget_s`` goes into every arm's config (``controller.max_rl_time_s``, the step count a
    cap), and ``snapshot_samples_per_prompt`` only into the snapshot scoring, not the runs, each run's curve
    printed as it is scored."""
    from benchmarks import headline

    runs: list[list[str]] = []
    scored: list[list[str]] = []

    def fake_run(overrides: list[str], run_dir, warmup_s: float) -> dict:
        runs.append(overrides)
        return {
            "snapshots": [{"t": 0.0, "version": 0, "path": "v0"}, {"t": 90.0, "version": 5, "path": "v5"}],
            "steady_state_tokens_per_s": 1.0,
            "trained_tokens_per_s": 1.0,
            "staleness_mean": 0.0,
        }

    def fake_evaluate(overrides: list[str], snapshots: list[dict]) -> list[float]:
        scored.append(overrides)
        return [0.2, 0.6][: len(snapshots)]

    monkeypatch.setattr(run_files, "run_and_measure", fake_run)
    monkeypatch.setattr(headline, "evaluate_snapshots", fake_evaluate)
    out = headline.run_headline_bench(
        str(tmp_path / "h.json"),
        workload="task",
        etas=(0, 4),
        seeds=(0,),
        steps=500,
        time_budget_s=90.0,
        snapshot_samples_per_prompt=8,
        sync_setting="threads1-trainer-process",
        out_dir=str(tmp_path / "runs"),
    )
    assert len(runs) == 2
    assert all("controller.max_rl_time_s=90.0" in o and "controller.total_steps=500" in o for o in runs)
    assert not any("eval.samples_per_prompt=8" in o for o in runs)
    assert all(o.count("eval.samples_per_prompt=8") == 1 for o in scored) and len(scored) == 2
    assert "(scored 2/2): seed 0, eta 4: 0.200 0.600" in capsys.readouterr().out
    assert out["time_budget_s"] == 90.0 and out["eval_samples"] == load_config(None, scored[0]).task.eval_size * 8
    with pytest.raises(ValueError, match="time_budget_s"):
        headline.run_headline_bench(None, workload="task", time_budget_s=-1, out_dir=str(tmp_path / "runs"))


def _fake_headline_run(runs: list[list[str]], stop_after: int | None = None):
    """A ``run_and_measure`` whose final accuracy peaks at lr 1e-4 for η = 0 and 2e-4 for η > 0 (a tuning run) and
    whose snapshots rise to that accuracy (an arm); KeyboardInterrupt once ``stop_after`` runs are made."""

    def value(overrides: list[str], key: str) -> float:
        return float(next(o.split("=")[1] for o in reversed(overrides) if o.startswith(f"{key}=")))

    def fake_run(overrides: list[str], run_dir, warmup_s: float) -> dict:
        if stop_after is not None and len(runs) == stop_after:
            raise KeyboardInterrupt
        runs.append(overrides)
        eta, lr = value(overrides, "controller.max_staleness"), value(overrides, "trainer.lr")
        after = 0.8 - 1000 * abs(lr - (1e-4 if eta == 0 else 2e-4))
        snapshots = value(overrides, "controller.snapshot_every_s") > 0
        return {
            "accuracy_before": 0.2,
            "accuracy_after": after,
            "snapshots": [{"t": 0.0, "version": 0, "path": "v0"}, {"t": 60.0, "version": 9, "path": "v9"}]
            if snapshots
            else [],
            "steady_state_tokens_per_s": 1.0,
            "trained_tokens_per_s": 1.0,
            "staleness_mean": 0.0,
        }

    return fake_run


def _two_arm_bench(tmp_path, **more) -> dict:
    """``run_headline_bench``'s keywords for η = 0 and η = 4 on one seed of the default task, 20 steps, the
    synchronous setting named (no probe), run directories under ``tmp_path``; ``more`` added."""
    return dict(
        workload="task",
        etas=(0, 4),
        seeds=(0,),
        steps=20,
        sync_setting="threads1-trainer-process",
        out_dir=str(tmp_path / "runs"),
        **more,
    )


def test_each_arm_runs_at_the_step_size_it_was_tuned_to_and_tuning_continues_from_its_progress_file(
    tmp_path, monkeypatch
) -> None:
    from benchmarks import headline

    monkeypatch.setattr(headline, "evaluate_snapshots", lambda overrides, snaps: [0.2, 0.6][: len(snaps)])
    kwargs = _two_arm_bench(tmp_path, lrs=(5e-5, 1e-4, 2e-4), tune_seeds=(7, 8))
    result = tmp_path / "h.json"
    runs: list[list[str]] = []
    monkeypatch.setattr(run_files, "run_and_measure", _fake_headline_run(runs, stop_after=4))
    with pytest.raises(KeyboardInterrupt):
        headline.run_headline_bench(str(result), **kwargs)
    progress = tmp_path / "h.progress.json"
    kept = json.loads(progress.read_text())["tuning_rows"]
    assert [(r["max_staleness"], r["lr"], r["seed"]) for r in kept] == [
        (0, 5e-5, 7),
        (0, 1e-4, 7),
        (0, 2e-4, 7),
        (4, 5e-5, 7),
    ]
    with pytest.raises(ConfigError, match="--tuning-from"):  # its rows would be replaced
        headline.run_headline_bench(str(result), **kwargs)

    runs.clear()
    monkeypatch.setattr(run_files, "run_and_measure", _fake_headline_run(runs))
    out = headline.run_headline_bench(str(result), tuning_from=[str(progress)], **kwargs)
    assert len(runs) == 2 * 3 * 2 - 4 + 2  # the tuning runs not yet made, then the two arms
    assert out["best_lrs"] == {"0": 1e-4, "4": 2e-4} and len(out["tuning_rows"]) == 12
    arms = runs[-2:]
    assert "trainer.lr=0.0001" in arms[0] and "controller.max_staleness=0" in arms[0]
    assert "trainer.lr=0.0002" in arms[1] and "controller.max_staleness=4" in arms[1]
    assert [r["lr"] for r in out["rows"]] == [1e-4, 2e-4] and not progress.exists()
    table = {(t["max_staleness"], t["lr"]): t for t in out["tuning"]}
    assert table[(4, 2e-4)]["n"] == 2 and table[(4, 2e-4)]["accuracy_after_mean"] == pytest.approx(0.8)


def test_an_interrupted_invocations_finished_tuning_runs_and_arms_are_read_again_not_run(tmp_path, monkeypatch) -> None:
    """``reuse``: a tuning run or an arm whose finished run (same name, same config: ``runs.reusable_run``) lies under
    the earlier invocation's directory is measured from there and its row says ``reused``; the rest run in the new
    directory (seams faked: which runs are finished, the two measures, the snapshot scoring)."""
    from benchmarks import headline

    earlier = tmp_path / "earlier"
    finished = {"tune-s7-eta0-lr0.0001", "tune-s7-eta4-lr0.0001", "s0-eta0"}
    runs: list[list[str]] = []
    measured_again: list[str] = []
    monkeypatch.setattr(
        run_files,
        "reusable_run",
        lambda overrides, run_dir: run_dir.parent == earlier and run_dir.name in finished,
    )

    def measure_finished(run_dir, warmup_s: float) -> dict:
        measured_again.append(run_dir.name)
        return {
            "accuracy_after": 0.5,
            "snapshots": [{"t": 0.0, "version": 0, "path": "v0"}] if run_dir.name.startswith("s") else [],
            "steady_state_tokens_per_s": 1.0,
            "trained_tokens_per_s": 1.0,
            "staleness_mean": 0.0,
            "run_dir": str(run_dir),
        }

    monkeypatch.setattr(run_files, "measure_finished_run", measure_finished)
    monkeypatch.setattr(run_files, "run_and_measure", _fake_headline_run(runs))
    monkeypatch.setattr(headline, "evaluate_snapshots", lambda overrides, snaps: [0.3] * len(snaps))
    out = headline.run_headline_bench(
        None, **_two_arm_bench(tmp_path, lrs=(1e-4, 2e-4), tune_seeds=(7,), reuse=str(earlier))
    )
    assert sorted(measured_again) == sorted(finished)
    assert len(runs) == 4 - 2 + 2 - 1  # two tuning runs and one arm were read back
    reused = [(r["max_staleness"], r["lr"]) for r in out["tuning_rows"] if r.get("reused")]
    assert reused == [(0, 1e-4), (4, 1e-4)]
    arms = {r["max_staleness"]: r for r in out["rows"]}
    assert arms[0]["reused"] and arms[0]["run_dir"] == str(earlier / "s0-eta0") and "reused" not in arms[4]
    assert out["reused_from"] == str(earlier)


def test_reuse_must_name_a_directory(tmp_path, capsys) -> None:
    from benchmarks.__main__ import main as bench_main

    with pytest.raises(SystemExit) as stopped:
        bench_main(["headline", "--reuse", str(tmp_path / "missing")])
    assert stopped.value.code == 2
    assert "is not a directory" in capsys.readouterr().err


def test_tuning_options_refuse_what_would_flatter_or_conflict() -> None:
    from benchmarks.__main__ import build_parser
    from benchmarks.headline import tuning_options

    def check(argv: list[str], overrides: list[str] = ()) -> tuple:
        args = build_parser("headline").parse_args(argv)
        return tuning_options(args, list(overrides), (0, 1, 2))

    assert check([]) == ((), (), [])
    assert check(["--lrs", "5e-5,1e-4", "--tune-seeds", "6,7"]) == ((5e-5, 1e-4), (6, 7), [])
    for argv, overrides, message in [
        (["--lrs", "1e-4"], [], "needs --tune-seeds"),
        (["--lrs", "1e-4", "--tune-seeds", "2,3"], [], r"\[2\] are also in --seeds"),
        (["--lrs", "0,1e-4", "--tune-seeds", "5"], [], "must be > 0"),
        (["--lrs", "1e-4", "--tune-seeds", "5"], ["trainer.lr=3e-4"], "leave it out of --set"),
        (["--tuning-from", "x.json"], [], "need --lrs"),
    ]:
        with pytest.raises(ConfigError, match=message):
            check(argv, overrides)
