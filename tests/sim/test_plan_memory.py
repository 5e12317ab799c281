"""``asyncrl plan``'s memory section (``cli/plan.py`` over ``launch.memory``): the estimate of the recommended
run, the same that ``asyncrl train`` checks at start, against ``--device-memory-gib`` or this machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from asyncrl.cli import main
from asyncrl.cli.plan import memory_payload
from asyncrl.config import load_config
from asyncrl.launch.memory import estimate_memory, model_shape
from asyncrl.models import build_tiny_policy, tiny_spec
from tests.sim.test_plan import SMALL


def _payload(overrides: list[str]) -> dict:
    """The parts of a plan's payload that ``memory_payload`` reads."""
    return {"workload": {"config_overrides": [], "config_file": ""}, "recommended": {"overrides": overrides}}


def test_plan_prints_and_writes_the_memory_estimate(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text(yaml.safe_dump(SMALL))
    out = tmp_path / "plan.json"
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
            "0,1",
            "--marks",
            "0",
            "--modes",
            "keep",
            "--device-memory-gib",
            "0.01",
            "--json",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "memory of the recommended run (the tiny default" in text and "DOES NOT FIT in 10.2 MiB" in text
    data = json.loads(out.read_text())
    (device,) = data["memory"]["devices"]
    assert device["fits"] is False and device["available_bytes"] == int(0.01 * 2**30)
    assert device["total_bytes"] == sum(p["bytes"] for p in device["parts"])
    cfg = load_config(None, data["recommended"]["overrides"])
    shape = model_shape(cfg)
    assert shape is not None and device["total_bytes"] == estimate_memory(cfg, shape).devices[0].total
    assert "--device-memory-gib 0.01" in data["command_line"]


def test_a_ray_recommendation_with_a_model_is_estimated_per_gpu(tmp_path: Path) -> None:
    model = build_tiny_policy(tmp_path / "m", tiny_spec(load_config().sft))
    overrides = [
        "launch.kind=ray",
        "rollout.num_engines=2",
        "launch.trainer_ranks=2",
        "launch.gpus_per_engine=1",
        "launch.gpus_per_trainer=1",
    ]
    m = memory_payload(_payload(overrides), str(model), 80.0)
    engine, rank = m["devices"]
    assert (engine["count"], rank["count"]) == (2, 2) and engine["fits"] and rank["fits"]
    assert {p["name"] for p in engine["parts"]} == {"engine weights", "engine KV cache"}
    assert "Adam moments" in {p["name"] for p in rank["parts"]}
    assert m["model"] == str(model) and m["params"] > 0


def test_a_model_without_config_is_one_clear_error(tmp_path: Path) -> None:
    from asyncrl.config import ConfigError

    with pytest.raises(ConfigError, match="no readable config.json"):
        memory_payload(_payload([]), str(tmp_path), None)
