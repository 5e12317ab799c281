"""``asyncrl plan`` (``sim/plan.py``, ``cli/plan.py``, ``sim/plan_workloads.py``): the rule, the
search against an exhaustive one, a synthetic profile whose answer is known, overrides the config accepts,
bad input."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from asyncrl.cli import main
from asyncrl.config import load_config
from asyncrl.sim.output import SimResult
from asyncrl.sim.plan import (
    PlanRequest,
    Prediction,
    Setting,
    Split,
    candidate_settings,
    choose,
    eta_grid,
    plan,
    setting_overrides,
    splits,
)
from asyncrl.sim.plan_workloads import PlanWorkload, named_workloads, resolve_workload
from asyncrl.sim.profile import CostProfile, load_profile

SMALL = {
    "batch_size": 4,
    "group_size": 2,
    "max_concurrent": 64,
    "high_water_unit": "groups",
    "weight_sync": "inflight",
    "interrupt_mode": "keep",
    "high_water_batches": 0,
    "lengths": "constant",
    "length_median": 40,
    "max_new_tokens": 64,
    "prompt_len": 10,
}


def result(throughput: float, staleness: float = 0.0, **extra: float) -> SimResult:
    """A ``SimResult`` with the two figures the rule reads (the rest zero)."""
    values: dict = {f.name: 0 for f in dataclasses.fields(SimResult)}
    values.update(
        profile="fake",
        staleness_hist={},
        groups={},
        steady_state_tokens_per_s=throughput,
        staleness_mean=staleness,
        steps=10,
        **extra,
    )
    return SimResult(**values)


def pred(engines: int, eta: int, mark: int, mode: str, throughput: float, staleness: float) -> Prediction:
    return Prediction.of(Setting(Split(engines, 1), eta, mark, mode), "confirm", result(throughput, staleness))


# ------------------------------------------------------------------------------------------- the rule
def test_the_rule_takes_the_lowest_staleness_within_the_target_of_the_best() -> None:
    preds = [
        pred(1, 8, 0, "keep", 1000, 3.0),  # the fastest
        pred(1, 4, 2, "keep", 960, 1.5),  # within 5%, less stale
        pred(1, 2, 1, "keep", 955, 1.5),  # within 5%, as stale, smaller eta: the answer
        pred(1, 1, 1, "keep", 940, 0.6),  # 6% slower: out
        pred(1, 0, 0, "keep", 500, 0.0),
    ]
    assert choose(preds).setting == Setting(Split(1, 1), 2, 1, "keep")
    assert choose(preds, target_fraction=0.9).setting.max_staleness == 1
    assert choose(preds, target_fraction=1.0).setting.max_staleness == 8
    assert choose(preds, target_fraction=0.4, max_mean_staleness=0.0).setting.max_staleness == 0
    with pytest.raises(ValueError, match="mean staleness <= 0.5"):
        choose(preds, max_mean_staleness=0.5)


# ---------------------------------------------------------------------------------- the candidates
def test_grids_splits_and_marks() -> None:
    assert eta_grid(8) == [0, 1, 2, 4, 8] and eta_grid(6) == [0, 1, 2, 4, 6] and eta_grid(0) == [0]
    assert eta_grid(8, (4, 0)) == [0, 4]
    cpu = load_profile("cpu-2core-tiny")
    assert splits(2, cpu, (0.25, 0.5, 0.875)) == [Split(1, 1)]  # the local launcher's only split
    assert splits(8, cpu, (0.25, 0.5, 0.75)) == [Split(2, 6), Split(4, 4), Split(6, 2)]
    wide = dataclasses.replace(cpu, engine=dataclasses.replace(cpu.engine, devices=2))
    assert splits(8, wide, (0.5, 0.875)) == [Split(2, 4), Split(3, 2)]  # whole engines of 2 devices
    request = PlanRequest(cpu, PlanWorkload("w", SMALL), 2, max_staleness=4, marks=(0, 1, 2, 4), modes=("keep",))
    marks = {(s.max_staleness, s.high_water_batches) for s in candidate_settings(Split(1, 1), request)}
    # η = 0 once; a mark above η never binds (it is no mark), so it is not simulated twice
    assert marks == {(0, 0), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2), (4, 0), (4, 1), (4, 2), (4, 4)}


def synthetic_throughput(s: Setting) -> tuple[float, float]:
    """A known model: generation grows with engines and asynchrony (to eta 4), abort costs 20%, marks cost
    a little throughput and save staleness; the trainer caps at 260 tokens/s per rank."""
    gen = s.split.engines * 100 * (1 + 0.25 * min(s.max_staleness, 4)) * (0.8 if s.interrupt_mode == "abort" else 1)
    gen *= 1 - 0.02 * (s.high_water_batches or 0)
    staleness = s.max_staleness / 2 if not s.high_water_batches else min(s.max_staleness, s.high_water_batches) / 2
    return min(gen, s.split.trainer_ranks * 260), staleness


def test_the_search_finds_what_an_exhaustive_search_under_the_rule_finds() -> None:
    cpu = load_profile("cpu-2core-tiny")
    request = PlanRequest(cpu, PlanWorkload("w", SMALL), 8, max_staleness=8, steps=5)

    def evaluate(setting: Setting, scenario: object) -> SimResult:
        return result(*synthetic_throughput(setting))

    chosen = plan(request, evaluate=evaluate, progress=False)
    every = [
        Prediction.of(s, "confirm", evaluate(s, None))
        for sp in splits(8, cpu, request.split_fractions)
        for s in candidate_settings(sp, request)
    ]
    assert chosen.recommended.setting == choose(every).setting
    # 4 engines x 100 x 2 = 800 <= 4 ranks x 260; a mark of 1 batch keeps 98% at a quarter of the staleness
    assert chosen.recommended.setting == Setting(Split(4, 4), 4, 1, "keep")
    assert len(chosen.predictions) < len(every)  # phase 1 pruned splits


def synthetic_profile(tmp_path: Path) -> Path:
    """A free trainer, two slots per engine and a costly prefill: more engines generate more, abort re-prefills
    at a high cost."""
    cpu = load_profile("cpu-2core-tiny").to_dict()
    cpu.update(name="synthetic", extra={})
    cpu["engine"].update(
        decode_base_s=0.01,
        decode_per_seq_s=0.0,
        decode_per_ctx_token_s=0.0,
        prefill_per_token_s=0.01,
        update_s=0.0,
        max_slots=2,
    )
    cpu["trainer"].update(base_s=0.001, per_token_s=0.0)
    cpu["sync"]["export_s"] = 0.0
    path = tmp_path / "synthetic.json"
    path.write_text(json.dumps(cpu))
    CostProfile.from_dict(cpu)
    return path


def test_on_a_synthetic_profile_the_plan_is_the_known_answer(tmp_path: Path) -> None:
    """Trainer free: every device but one should be an engine; prefill costly: keep, not abort."""
    request = PlanRequest(
        load_profile(synthetic_profile(tmp_path)),
        PlanWorkload("w", SMALL),
        4,
        max_staleness=2,
        marks=(0,),
        split_fractions=(0.25, 0.5, 0.75),
        steps=20,
    )
    chosen = plan(request, progress=False)
    assert chosen.recommended.setting.split == Split(3, 1)
    assert chosen.recommended.setting.interrupt_mode == "keep" or chosen.recommended.setting.max_staleness == 0
    best = max(p.steady_state_tokens_per_s for p in chosen.predictions if p.phase == "confirm")
    assert chosen.recommended.steady_state_tokens_per_s >= 0.95 * best


# ----------------------------------------------------------------------------------- the overrides
@pytest.mark.parametrize("split", [Split(1, 1), Split(48, 16)])
def test_the_overrides_are_config_keys_the_config_accepts(split: Split) -> None:
    request = PlanRequest(load_profile("h800-7b"), named_workloads()["long"], 64)
    overrides = setting_overrides(Setting(split, 4, 2, "keep"), request)
    cfg = load_config(None, [*request.workload.config_overrides, *overrides])
    assert cfg.controller.max_staleness == 4 and cfg.controller.high_water_batches == 2
    assert cfg.rollout.interrupt_mode == "keep" and cfg.rollout.num_engines == split.engines
    assert cfg.launch.trainer_ranks == split.trainer_ranks
    assert cfg.launch.kind == ("local" if split == Split(1, 1) else "ray")


def test_named_workloads_are_valid_scenarios_and_the_bench_workloads_configs() -> None:
    for name, w in named_workloads().items():
        assert resolve_workload(name) == w
        load_config(None, list(w.config_overrides))
    long = named_workloads()["long"]
    assert long.scenario["batch_size"] == 8 and long.scenario["max_new_tokens"] == 2048
    assert long.scenario["high_water_unit"] == "samples" and long.bench_workload == "long"


# ------------------------------------------------------------------------------------ the command
def test_plan_command_prints_writes_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text(yaml.safe_dump(SMALL))
    out, png = tmp_path / "plan.json", tmp_path / "plan.png"
    rc = main(
        [
            "plan",
            "--profile",
            "cpu-2core-tiny",
            "--workload",
            str(workload),
            "--devices",
            "2",
            "--steps",
            "20",
            "--etas",
            "0,1,2",
            "--marks",
            "0,1",
            "--json",
            str(out),
            "--plot",
            str(png),
            "--no-progress",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "recommended:" in text and "rule:" in text and "asyncrl train" in text
    data = json.loads(out.read_text())
    assert sum(r["recommended"] for r in data["candidates"]) == 1 and data["recommended"]["qualifies"]
    load_config(None, data["recommended"]["overrides"])
    assert png.stat().st_size > 10_000
    assert data["command_line"].startswith("asyncrl plan --profile cpu-2core-tiny --workload ")


def test_a_run_directory_is_a_workload_replayed_from_its_ledger(tmp_path: Path) -> None:
    from tests.sim.test_scenario import _write_run

    run = tmp_path / "run"
    _write_run(run)
    w = resolve_workload(str(run))
    assert w.scenario["lengths"] == "ledger" and w.scenario["batch_size"] == 2 and "max_staleness" not in w.scenario
    assert w.config_file == str(run / "config.yaml") and not w.bench_workload
    request = PlanRequest(load_profile("cpu-2core-tiny"), w, 2, max_staleness=1, marks=(0,), modes=("keep",), steps=20)
    chosen = plan(request, progress=False)
    assert {p.setting.max_staleness for p in chosen.predictions} == {0, 1}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--devices", "1"], "at least 2"),
        (["--profile", "no-such-profile"], "no cost profile 'no-such-profile'"),
        (["--workload", "no-such-workload"], "unknown workload 'no-such-workload'"),
        (["--max-staleness", "2", "--etas", "0,4"], "exceed the bound"),
        (["--target", "1.5"], "--target must be in (0, 1]"),
        (["--modes", "pause"], "--modes"),
        (["--etas", "a,b"], "comma-separated integers"),
    ],
)
def test_bad_input_is_a_clear_error(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["plan", "--no-progress", *argv]) == 2
    assert message in capsys.readouterr().err
