"""``python -m benchmarks plan-check``'s choice of settings and its analysis, on fake plans and fake runs."""

from __future__ import annotations

import pytest

from benchmarks.__main__ import main
from benchmarks.plan_check import PlanCheckError, analyse, check_plan, settings_to_run


def candidate(label: str, eta: int, throughput: float, recommended: bool = False, ray: bool = False) -> dict:
    overrides = ["launch.kind=ray"] if ray else []
    return {
        "label": label,
        "max_staleness": eta,
        "high_water_batches": 1,
        "interrupt_mode": "keep",
        "steady_state_tokens_per_s": throughput,
        "staleness_mean": eta / 2,
        "recommended": recommended,
        "overrides": [*overrides, f"controller.max_staleness={eta}"],
    }


def fake_plan(ray: bool = False, bench_workload: str = "long") -> dict:
    rows = [
        candidate("a8", 8, 1000),
        candidate("b4", 4, 990, recommended=True, ray=ray),
        candidate("c4", 4, 900),
        candidate("d2", 2, 800),
        candidate("e0", 0, 500),
        candidate("f8", 8, 950),
    ]
    return {"candidates": rows, "recommended": rows[1], "workload": {"name": "x", "bench_workload": bench_workload}}


def test_the_settings_run_are_the_recommendation_the_fastest_and_the_fastest_at_each_eta() -> None:
    assert [s["label"] for s in settings_to_run(fake_plan())] == ["b4", "a8", "e0", "d2"]
    assert [s["label"] for s in settings_to_run(fake_plan(), max_settings=2)] == ["b4", "a8"]
    with pytest.raises(PlanCheckError):
        settings_to_run(fake_plan(), max_settings=0)


def test_plans_this_machine_cannot_run_are_refused() -> None:
    assert check_plan(fake_plan()) == "long"
    with pytest.raises(PlanCheckError, match="no real-run config"):
        check_plan(fake_plan(bench_workload=""))
    with pytest.raises(PlanCheckError, match="Ray launcher"):
        check_plan(fake_plan(ray=True))


def run(label: str, seed: int, steady: float | None, whole: float = 1.0, predicted: float = 100.0) -> dict:
    return {
        "label": label,
        "seed": seed,
        "steady_state_tokens_per_s": steady,
        "trained_tokens_per_s": whole,
        "staleness_mean": 1.0,
        "predicted_tokens_per_s": predicted,
        "predicted_staleness_mean": 1.5,
    }


def test_analysis_ratio_to_the_best_measured_and_the_verdict() -> None:
    rows = [
        run("rec", 0, 95),
        run("rec", 1, 85),
        run("alt", 0, 100),
        run("alt", 1, 100),
        run("sync", 0, 50),
        run("sync", 1, 50),
    ]
    a = analyse(rows, "rec")
    assert a["measure"] == "steady_state_tokens_per_s" and a["best_measured"] == "alt"
    assert a["recommended_over_best"] == pytest.approx(0.9) and a["within_tolerance"]
    assert a["recommended_over_best_paired"]["mean"] == pytest.approx(0.9)
    rec = next(s for s in a["settings"] if s["label"] == "rec")
    assert rec["measured"]["mean"] == pytest.approx(90) and rec["prediction_error"] == pytest.approx(100 / 90 - 1)
    assert not analyse(rows, "rec", tolerance=0.05)["within_tolerance"]
    assert analyse(rows, "alt")["recommended_over_best"] == 1.0


def test_analysis_falls_back_to_the_whole_run_when_a_run_has_no_window() -> None:
    rows = [run("rec", 0, None, whole=80), run("alt", 0, 100, whole=100)]
    a = analyse(rows, "rec")
    assert a["measure"] == "trained_tokens_per_s" and a["recommended_over_best"] == pytest.approx(0.8)
    assert not a["within_tolerance"]
    with pytest.raises(PlanCheckError, match="no run of the recommended"):
        analyse(rows, "missing")


def test_the_command_needs_a_plan(capsys: pytest.CaptureFixture) -> None:
    assert main(["plan-check"]) == 2
    assert "--plan" in capsys.readouterr().err
