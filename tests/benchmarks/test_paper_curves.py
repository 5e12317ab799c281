"""``python -m benchmarks paper-curves`` (``benchmarks/paper_curves.py``, ``paper_report.py``): the sweeps on a tiny
scenario, the arms' devices, the analysis on hand-made points, the payload, the plot and the CLI."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from asyncrl.sim.run import Simulation, simulate
from asyncrl.sim.scenario import Scenario
from benchmarks import paper_report
from benchmarks.__main__ import main
from benchmarks.paper_curves import (
    PAPER,
    UNBOUNDED,
    CurvePoint,
    CurvesSpec,
    analyse_eta,
    analyse_scaling,
    analyse_step_time,
    arm_keys,
    eta_points,
    fit_length_median,
    is_monotone,
    plateau_eta,
    scaling_points,
    step_time_points,
)

TINY = {
    "batch_size": 4,
    "group_size": 2,
    "max_concurrent": 64,
    "high_water_unit": "groups",
    "weight_sync": "inflight",
    "interrupt_mode": "abort",
    "lengths": "lognormal",
    "length_median": 30,
    "length_sigma": 0.6,
    "length_within_sigma": 0.3,
    "prompt_len": 10,
    "filter_prob": 0.0,
}


def tiny_spec(**extra: object) -> CurvesSpec:
    keys = dict(
        workload=TINY,
        eta_profile="cpu-2core-tiny",
        eta_gpus=4,
        eta_max_new_tokens=96,
        etas=(0, 1, 4, UNBOUNDED),
        scaling_profiles=("cpu-2core-tiny",),
        contexts=(64,),
        prompt_reserve=16,
        gpu_counts=(4, 8),
        scaling_eta=2,
        step_time_eta=4,
        step_time_rows=(("cpu-2core-tiny", 4),),
        eta_steps=12,
        scaling_steps=8,
    )
    keys.update(extra)
    return CurvesSpec(**keys)  # type: ignore[arg-type]


class Recorder:
    """The real simulator, each scenario kept."""

    def __init__(self) -> None:
        self.scenarios: list[Scenario] = []

    def __call__(self, scenario: Scenario) -> Simulation:
        self.scenarios.append(scenario)
        return simulate(scenario)


def point(curve: str, arm: str, gpus: int, eta: int, tokens: float, step_s: float = 1.0, **extra: object) -> CurvePoint:
    values = dict(
        curve=curve,
        profile="p",
        gpus=gpus,
        max_new_tokens=100,
        arm=arm,
        max_staleness=eta,
        tokens_per_s=tokens,
        steady_state_tokens_per_s=tokens,
        step_s=step_s,
        staleness_mean=0.0,
        engine_busy=0.0,
        trainer_busy=0.0,
        stale_groups=0,
        engines=1,
        trainer_ranks=1,
        steps=10,
        cpu_s=0.0,
    )
    values.update(extra)
    return CurvePoint(**values)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------- the sweeps
def test_the_eta_sweep_simulates_each_eta_on_the_split_with_the_unbounded_one_labelled() -> None:
    run = Recorder()
    points = eta_points(run, tiny_spec())
    assert [p.eta_label for p in points] == ["0", "1", "4", "unbounded"]
    assert [p.arm for p in points] == ["sync", "async", "async", "async"]
    for s in run.scenarios:  # the workload's keys kept, the devices as a budget
        assert (s.gpus, s.batch_size, s.max_new_tokens, s.total_steps) == (4, 4, 96, 12)
        assert s.high_water_batches == 0 and s.profile == "cpu-2core-tiny"
    assert all(p.tokens_per_s > 0 and p.step_s > 0 and p.steps == 12 for p in points)
    assert all(p.steady_state_tokens_per_s <= p.tokens_per_s * 1.01 for p in points[1:])  # inventory held back
    assert {(p.engines, p.trainer_ranks) for p in points} == {(3, 1)}  # 4 GPUs at 75% inference
    assert points[0].staleness_mean == 0.0  # eta = 0 is synchronous
    assert max(p.staleness_mean for p in points) > 0.0
    assert points[1].tokens_per_s > points[0].tokens_per_s  # overlap pays on a generation-bound tiny run


def test_the_scaling_sweep_covers_every_arm_and_count_and_colocated_uses_every_gpu_twice() -> None:
    run = Recorder()
    points = scaling_points(run, tiny_spec())
    assert {(p.arm, p.gpus) for p in points} == {(a, g) for a in ("async", "sync", "sync-colocated") for g in (4, 8)}
    assert {p.max_new_tokens for p in points} == {48}  # context 64 - the prompt reserve
    colocated = [s for s in run.scenarios if s.gpus == 0]
    assert sorted((s.engines, s.trainer_ranks) for s in colocated) == [(4, 4), (8, 8)]
    assert all(s.max_staleness == 0 for s in colocated)
    asyncs = [p for p in points if p.arm == "async"]
    assert {p.max_staleness for p in asyncs} == {2} and all(p.steps == 8 for p in points)


def test_step_time_rows_reuse_the_eta_sweep_points_they_match() -> None:
    spec = tiny_spec()
    eta = eta_points(Recorder(), spec)
    run = Recorder()
    rows = step_time_points(run, spec, reuse=eta)
    assert run.scenarios == []  # sync (eta 0) and async at eta 4 on 4 GPUs: both in the sweep
    assert [(p.curve, p.arm, p.max_staleness) for p in rows] == [("step_time", "sync", 0), ("step_time", "async", 4)]
    assert rows[1].tokens_per_s == eta[2].tokens_per_s
    rows = step_time_points(run, dataclasses.replace(spec, step_time_eta=2), reuse=eta)
    assert len(run.scenarios) == 1 and rows[1].max_staleness == 2  # eta 2 was not swept: simulated


def test_the_length_fit_recovers_the_median_that_made_the_target_step_time() -> None:
    spec = tiny_spec(workload={**TINY, "lengths": "constant", "length_median": 40})
    target = eta_points(Recorder(), dataclasses.replace(spec, etas=(0,), eta_steps=6))[0].step_s
    fit = fit_length_median(Recorder(), spec, target, lo=5.0, hi=90.0, iters=10, steps=6)
    assert fit["length_median"] == pytest.approx(40, rel=0.1)
    assert len(fit["trace"]) == 10 and fit["target_step_s"] == target
    steps = [t["step_s"] for t in sorted(fit["trace"], key=lambda t: t["length_median"])]
    assert is_monotone(steps, tolerance=0.0)  # a synchronous step grows with the lengths


def test_arm_keys_reject_an_unknown_arm() -> None:
    with pytest.raises(ValueError, match="unknown arm"):
        arm_keys("pipelined", 8, 2, 0.75)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------- the analysis
def test_plateau_and_monotone() -> None:
    assert plateau_eta({"0": 1.0, "1": 2.0, "2": 2.9, "4": 3.0}) == "2"
    assert plateau_eta({"0": 1.0, "1": 2.0, "2": 2.9, "4": 3.0}, fraction=0.99) == "4"
    assert plateau_eta({}) is None
    assert is_monotone([1.0, 2.0, 1.99]) and not is_monotone([1.0, 2.0, 1.9])
    assert not is_monotone([1.0, 2.0, 1.99], tolerance=0.0)


def test_eta_analysis_against_the_paper_numbers() -> None:
    paper = PAPER["eta_throughput"]["tokens_per_s"]
    sim = [point("eta", "sync" if e == 0 else "async", 8, e, 2 * paper[str(e)]) for e in (0, 1, 2, 4, 8, 16)]
    sim.append(point("eta", "async", 8, UNBOUNDED, 10.0))
    a = analyse_eta(sim)
    rows = {r["eta"]: r for r in a["rows"]}
    assert rows["8"]["ratio_sim_paper"] == pytest.approx(2.0)
    assert rows["8"]["relative_ratio_sim_paper"] == pytest.approx(1.0)
    assert rows["4"]["paper_relative"] == pytest.approx(356.6 / 128.7)
    assert rows["unbounded"]["paper_tokens_per_s"] is None and rows["unbounded"]["ratio_sim_paper"] is None
    assert a["sim_monotone"] and a["paper_monotone"]  # the unbounded point is left out of the shape
    assert a["sim_plateau_eta_95"] == a["paper_plateau_eta_95"] == "8"
    assert a["paper_plateau_eta_90"] == "2"
    assert a["sim_max_speedup"] == pytest.approx(a["paper_max_speedup"])


def test_scaling_analysis_efficiency_and_speedups() -> None:
    pts = [point("scaling", "async", g, 4, t) for g, t in ((32, 100.0), (64, 200.0), (128, 300.0))]
    pts += [point("scaling", "sync", g, 0, 50.0) for g in (32, 64, 128)]
    pts += [point("scaling", "sync-colocated", g, 0, 25.0 * g / 32) for g in (32, 64, 128)]
    rows = {r["arm"]: r for r in analyse_scaling(pts)}
    a = rows["async"]
    assert a["efficiency"] == {"32": 1.0, "64": 1.0, "128": 0.75}
    assert (a["from_gpus"], a["to_gpus"], a["efficiency_smallest_to_largest"]) == (32, 128, 0.75)
    assert a["speedup_vs_sync"] == {"32": 2.0, "64": 4.0, "128": 6.0}
    assert a["speedup_vs_sync-colocated"]["128"] == pytest.approx(3.0)
    assert rows["sync-colocated"]["efficiency_smallest_to_largest"] == pytest.approx(1.0)
    assert "speedup_vs_sync" not in rows["sync"]


def test_step_time_analysis_converts_the_paper_hours_to_seconds_per_step() -> None:
    pts = [
        point("step_time", "sync", 128, 0, 1.0, step_s=295.2, profile="h800-1.5b"),
        point("step_time", "async", 128, 8, 1.0, step_s=53.28, profile="h800-1.5b"),
    ]
    (row,) = analyse_step_time(pts)  # the 7B row has no points: left out
    assert row["paper_sync_step_s"] == pytest.approx(147.6) and row["paper_async_step_s"] == pytest.approx(53.28)
    assert row["ratio_sim_paper_sync"] == pytest.approx(2.0) and row["ratio_sim_paper_async"] == pytest.approx(1.0)
    assert row["paper_speedup"] == pytest.approx(41.0 / 14.8) and row["sim_speedup"] == pytest.approx(295.2 / 53.28)


# ------------------------------------------------------------------------------- payload, plot, CLI
def test_the_payload_holds_every_point_the_paper_and_the_profiles(tmp_path: Path) -> None:
    spec = tiny_spec()
    d = paper_report.run_paper_curves(spec, run=Recorder(), command="test")
    curves = [p["curve"] for p in d["points"]]
    assert curves.count("eta") == 4 and curves.count("scaling") == 6 and curves.count("step_time") == 2
    assert d["paper"] is PAPER and list(d["spec"]["etas"]) == [0, 1, 4, UNBOUNDED]
    assert set(d["profiles"]) == {"cpu-2core-tiny"} and d["profiles"]["cpu-2core-tiny"]["sources"]
    checks = d["horizon_check"]
    assert [(h["curve"], h["steps"]) for h in checks] == [("eta", [6, 12]), ("scaling", [4, 8])]
    json.dumps(d)  # JSON-ready
    png = paper_report.plot_curves(d, tmp_path / "curves.png")
    assert png.stat().st_size > 10_000
    paper_report.print_curves(d)


def test_the_command_writes_the_json_and_the_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = tiny_spec()
    monkeypatch.setattr(paper_report, "areal_workload", lambda: TINY)
    monkeypatch.setattr(
        paper_report, "CurvesSpec", lambda workload, **kw: dataclasses.replace(tiny, workload=workload, **kw)
    )
    out = tmp_path / "r" / "curves.json"
    assert main(["paper-curves", "--json", str(out), "--steps", "10"]) == 0
    d = json.loads(out.read_text())
    assert d["spec"]["eta_steps"] == 10 and d["command"].endswith("--steps 10")
    assert out.with_suffix(".png").is_file() and d["fit"] is None
    assert "eta sweep" in capsys.readouterr().out
    fitted = tmp_path / "fitted.json"
    assert main(["paper-curves-fitted", "--json", str(fitted)]) == 0
    d = json.loads(fitted.read_text())
    assert d["fit"]["length_median"] == d["spec"]["workload"]["length_median"] != TINY["length_median"]
    assert d["command"].startswith("python -m benchmarks paper-curves-fitted")
