"""``python -m benchmarks async|interrupt|ablation`` hand the user's ``--model`` and ``--set`` to every run;
``ablation``'s grid flags."""

from __future__ import annotations

import pytest

from benchmarks import ablation, async_bench, interrupt
from benchmarks.__main__ import main as bench_main


@pytest.mark.parametrize("name", ["async", "interrupt", "ablation"])
def test_bench_model_flag_reaches_every_run(monkeypatch, tmp_path, name) -> None:
    seen: dict = {}

    def fake(json_path, **kwargs):
        seen.update(kwargs, json_path=json_path)

    monkeypatch.setattr(async_bench, "run_async_bench", fake)
    monkeypatch.setattr(interrupt, "run_interrupt_bench", fake)
    monkeypatch.setattr(ablation, "run_ablation", fake)
    argv = [name, "--model", str(tmp_path), "--set", "controller.batch_size=4", "--steps", "3"]
    assert bench_main(argv) == 0
    assert seen["overrides"] == ["controller.batch_size=4", f"model.path={tmp_path}"]
    assert seen["steps"] == 3


def test_bench_without_model_flag_leaves_the_model_to_the_workloads(monkeypatch) -> None:
    seen: dict = {}
    monkeypatch.setattr(async_bench, "run_async_bench", lambda json_path, **kw: seen.update(kw))
    assert bench_main(["async", "--workload", "long", "--etas", "0,8"]) == 0
    assert seen["overrides"] == [] and seen["workloads"] == ("long",) and seen["etas"] == (0, 8)


def test_bench_ablation_grid_flags(monkeypatch) -> None:
    seen: dict = {}
    monkeypatch.setattr(ablation, "run_ablation", lambda json_path, **kw: seen.update(kw))
    argv = [
        "ablation",
        "--lags",
        "0,4",
        "--objectives",
        "decoupled,naive,uncorrected",
        "--lrs",
        "1e-4,3e-4",
        "--seeds",
        "0,1,2",
        "--steps",
        "40",
    ]
    assert bench_main(argv) == 0
    assert seen["lags"] == (0, 4) and seen["objectives"] == ("decoupled", "naive", "uncorrected")
    assert seen["lrs"] == (1e-4, 3e-4) and seen["seeds"] == (0, 1, 2) and seen["steps"] == 40
    assert seen["collapse_fraction"] == 0.5
    assert bench_main(["ablation", "--objectives", "ppo2"]) == 2  # a config error names the choices
    assert bench_main(["ablation", "--lags", "one"]) == 2
