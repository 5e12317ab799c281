"""``python -m benchmarks adaptive`` (``benchmarks/adaptive.py``): the analysis on hand-made rows, the arms run
side by side through a stand-in runner, and a tiny simulated invocation end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.__main__ import main as bench_main
from benchmarks.adaptive import analyse, arms, run_adaptive_bench
from benchmarks.adaptive_sim import simulated_runner


def _row(workload: str, arm: str, seed: int, tok_s: float, acc: float | None) -> dict[str, Any]:
    return {
        "workload": workload,
        "arm": arm,
        "seed": seed,
        "steady_state_tokens_per_s": tok_s,
        "accuracy_after": acc,
        "staleness_mean": 1.0,
    }


def test_analysis_pairs_adaptive_with_the_best_fixed_arm_by_seed() -> None:
    rows = [
        *(_row("task", "eta=0", s, 50.0, 0.70) for s in range(3)),
        *(_row("task", "eta=4", s, t, a) for s, t, a in ((0, 100.0, 0.60), (1, 110.0, 0.66), (2, 90.0, 0.63))),
        *(_row("task", "adaptive", s, t, a) for s, t, a in ((0, 98.0, 0.64), (1, 106.0, 0.62), (2, 88.0, 0.65))),
        *(_row("long", "eta=4", s, 100.0, 0.10) for s in range(3)),
        *(_row("long", "adaptive", s, 80.0, 0.02) for s in range(3)),
    ]
    task, long = analyse(rows)
    assert task["best_fixed"] == "eta=4"  # by throughput, not accuracy
    ratio = task["throughput_ratio_vs_best"]
    assert ratio["n"] == 3 and ratio["mean"] == pytest.approx((0.98 + 106 / 110 + 88 / 90) / 3)
    assert ratio["low"] < ratio["mean"] < ratio["high"]
    assert task["accuracy_delta_vs_best"]["mean"] == pytest.approx((0.04 - 0.04 + 0.02) / 3)
    assert task["accuracy_within_spread"] is True and task["meets_target"] is True
    assert task["arms"]["eta=0"]["accuracy_after"]["mean"] == pytest.approx(0.70)
    assert long["throughput_ratio_vs_best"]["mean"] == pytest.approx(0.8)
    assert long["accuracy_within_spread"] is False and long["meets_target"] is False


def test_without_accuracies_the_target_is_throughput_alone() -> None:
    rows = [_row("sim", "eta=2", 0, 100.0, None), _row("sim", "adaptive", 0, 96.0, None)]
    (item,) = analyse(rows)
    assert item["accuracy_within_spread"] is None and item["meets_target"] is True
    assert analyse([_row("sim", "eta=2", 0, 100.0, None)])[0].get("best_fixed") is None  # no adaptive arm


def test_arms_are_the_fixed_etas_then_adaptive_bounded_by_the_largest() -> None:
    assert arms((0, 2, 8)) == [
        ("eta=0", ["controller.max_staleness=0"]),
        ("eta=2", ["controller.max_staleness=2"]),
        ("eta=8", ["controller.max_staleness=8"]),
        ("adaptive", ["controller.max_staleness=8", "controller.adaptive=true"]),
    ]
    with pytest.raises(ValueError):
        arms(())


def test_every_arm_runs_seed_major_and_the_rows_and_analysis_are_written(tmp_path: Path) -> None:
    calls: list[tuple[str, str, int]] = []

    def run_one(workload: str, arm: str, seed: int, overrides: list[str]) -> dict[str, Any]:
        calls.append((workload, arm, seed))
        speed = {"eta=0": 50.0, "eta=4": 100.0, "adaptive": 97.0 + seed}[arm]
        return {"steady_state_tokens_per_s": speed, "accuracy_after": 0.5, "overrides": overrides}

    out = tmp_path / "adaptive.json"
    payload = run_adaptive_bench(str(out), workloads=("task",), etas=(0, 4), seeds=(0, 1), run_one=run_one)
    assert calls == [("task", a, s) for s in (0, 1) for a in ("eta=0", "eta=4", "adaptive")]
    adaptive = [r for r in payload["rows"] if r["adaptive"]]
    assert [r["max_staleness"] for r in adaptive] == [4, 4] and adaptive[0]["overrides"][
        -1
    ] == "controller.adaptive=true"
    written = json.loads(out.read_text())
    assert written["bench"] == "adaptive" and written["mode"] == "real" and written["bound"] == 4
    assert written["analysis"][0]["throughput_ratio_vs_best"]["mean"] == pytest.approx((0.97 + 0.98) / 2)


def test_a_simulated_invocation_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    keys = ("cpu-2core-tiny/task", "cpu-2core-tiny/long")
    payload = run_adaptive_bench(
        str(out), workloads=keys, etas=(0, 2), seeds=(0,), run_one=simulated_runner(12), mode="simulated"
    )
    assert payload["mode"] == "simulated" and {r["workload"] for r in payload["rows"]} == set(keys)
    for r in payload["rows"]:
        assert r["steady_state_tokens_per_s"] > 0 and r["accuracy_after"] is None
        assert r["eta_mean"] <= r["max_staleness"]
    fixed0 = [r for r in payload["rows"] if r["arm"] == "eta=0"]
    assert all(r["staleness_mean"] == 0 for r in fixed0)
    assert all("throughput_ratio_vs_best" in a for a in json.loads(out.read_text())["analysis"])


def test_the_cli_runs_the_simulated_mode_under_each_profile(tmp_path: Path) -> None:
    out = tmp_path / "cli.json"
    argv = [
        "adaptive",
        "--profile",
        "cpu-2core-tiny,h800-7b",
        "--workload",
        "task",
        "--etas",
        "0,2",
        "--seeds",
        "0",
        "--steps",
        "10",
        "--warmup-s",
        "1",
        "--json",
        str(out),
    ]
    assert bench_main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["workload"], r["arm"]) for r in rows] == [
        (f"{p}/task", a) for p in ("cpu-2core-tiny", "h800-7b") for a in ("eta=0", "eta=2", "adaptive")
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workload", "nope"], "unknown workload"),
        (["--etas=-1,2"], "eta"),
        (["--workload", "reason", "--profile", "cpu-2core-tiny"], "unknown workload"),  # simulated: task and long
    ],
)
def test_the_cli_checks_its_options_before_running(argv: list[str], message: str, capsys) -> None:
    assert bench_main(["adaptive", "--steps", "5", *argv]) == 2
    assert message in capsys.readouterr().err


def test_an_interrupted_invocations_finished_runs_are_measured_again_not_trained(tmp_path: Path, monkeypatch) -> None:
    """``reuse``: an arm whose finished run (same name, same config: ``runs.reusable_run``) lies under the earlier
    invocation's directory is measured from there (``measure_finished_run``) and its row says ``reused``; the
    others are trained into the new directory (seams faked: which runs are finished, the two measures, the
    admission means)."""
    from benchmarks import adaptive, async_bench, runs

    earlier = tmp_path / "earlier"
    # the workload's policy: a path, not the warm start's SFT (which a unit test must not train)
    monkeypatch.setattr(async_bench, "_policy_dir", lambda overrides, workload: str(tmp_path / "policy"))
    finished = {"task-s0-eta0", "task-s0-adaptive"}
    trained: list[str] = []
    monkeypatch.setattr(
        runs,
        "reusable_run",
        lambda overrides, run_dir: run_dir.parent == earlier and run_dir.name in finished and "run.seed=0" in overrides,
    )
    monkeypatch.setattr(
        runs,
        "measure_finished_run",
        lambda run_dir, warmup_s: {
            "steady_state_tokens_per_s": 100.0,
            "accuracy_after": 0.5,
            "measured_from": str(run_dir),
        },
    )

    def fake_train(overrides, run_dir, warmup_s):
        trained.append(run_dir.name)
        return {"steady_state_tokens_per_s": 90.0, "accuracy_after": 0.5, "measured_from": str(run_dir)}

    monkeypatch.setattr(runs, "run_and_measure", fake_train)
    monkeypatch.setattr(adaptive, "admission_means", lambda run_dir, overrides: {"eta_mean": 1.0})
    payload = run_adaptive_bench(
        None, workloads=("task",), etas=(0, 4), seeds=(0, 1), steps=2, out_dir=str(tmp_path / "new"), reuse=str(earlier)
    )
    by_name = {f"s{r['seed']}-{r['arm']}": r for r in payload["rows"]}
    assert trained == ["task-s0-eta4", "task-s1-eta0", "task-s1-eta4", "task-s1-adaptive"]
    assert by_name["s0-eta=0"]["reused"] and by_name["s0-eta=0"]["measured_from"] == str(earlier / "task-s0-eta0")
    assert by_name["s0-adaptive"]["reused"] and "reused" not in by_name["s1-adaptive"]
    assert payload["reused_from"] == str(earlier)
