"""Config loading, overrides and validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config import Config, ConfigError, load_config, parse_override
from tests.repo_paths import CONFIGS


def test_defaults_validate() -> None:
    cfg = load_config()
    assert cfg == Config()
    assert cfg.controller.max_staleness == 4


SHIPPED_CONFIGS = sorted(CONFIGS.glob("*.yaml"))


def test_the_shipped_configs_are_found() -> None:
    assert {"calculator.yaml", "calculator_adopt.yaml"} <= {p.name for p in SHIPPED_CONFIGS}


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads_and_validates(path: Path) -> None:
    cfg = load_config(path)
    assert cfg != Config()  # the file set something
    if path.name == "calculator_adopt.yaml":
        assert cfg.sft.second_stage_steps == 150 and cfg.sft.hidden_size == 192


def test_yaml_file_and_overrides_apply_in_order(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("controller:\n  max_staleness: 2\n  batch_size: 8\nalgo:\n  eps_clip: 0.3\n")
    cfg = load_config(path, ["controller.max_staleness=0", "trainer.betas=[0.8, 0.9]", "algo.behav_cap=null"])
    assert cfg.controller.max_staleness == 0
    assert cfg.controller.batch_size == 8
    assert cfg.algo.eps_clip == pytest.approx(0.3)
    assert cfg.trainer.betas == (0.8, 0.9)
    assert cfg.algo.behav_cap is None


def test_int_and_exponent_strings_are_accepted_for_float_fields() -> None:
    cfg = load_config(None, ["trainer.lr=1"])
    assert isinstance(cfg.trainer.lr, float) and cfg.trainer.lr == 1.0
    assert load_config(None, ["trainer.lr=2e-4"]).trainer.lr == 2e-4  # YAML 1.1 reads this as a string
    with pytest.raises(ConfigError, match="trainer.lr: expected a number"):
        load_config(None, ["trainer.lr=fast"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("controller.max_stalenes=2", "unknown config key 'controller.max_stalenes'"),
        ("nosuch.key=1", "unknown config key 'nosuch'"),
        ("controller.batch_size=abc", "controller.batch_size: expected an integer"),
        ("controller.batch_size=1.5", "controller.batch_size: expected an integer"),
        ("algo.advantage=ppo2", "algo.advantage: 'ppo2' is not one of"),
        ("controller.max_staleness=-1", "max_staleness must be >= 0"),
        ("rollout.group_size=0", "rollout.group_size must be > 0"),
        ("run.progress=yes please", "run.progress: expected true/false"),
        ("controller", "is not of the form key=value"),
        ("controller=3", "controller: expected a mapping"),
    ],
)
def test_bad_overrides_are_clear_errors(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        load_config(None, [override])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rollout.workflow=agent", "agent.tool_latency=gamma"], "agent.tool_latency: 'gamma' is not one of"),
        (["agent.tool_latency_median_s=0"], "agent.tool_latency_median_s must be > 0"),
        (["agent.tool_latency_sigma=-1"], "agent.tool_latency_sigma must be >= 0"),
        (["agent.tool_latency=lognormal"], "agent.tool_latency=lognormal needs rollout.workflow=agent"),
    ],
)
def test_bad_tool_latency_names_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_config(None, overrides)
    agent = load_config(None, ["rollout.workflow=agent", "agent.tool_latency=lognormal"]).agent
    assert (agent.tool_latency, agent.tool_latency_median_s, agent.tool_latency_sigma) == ("lognormal", 0.2, 1.0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["sft.hidden_size=0"], "sft.hidden_size must be > 0"),
        (["sft.num_layers=0"], "sft.num_layers must be > 0"),
        (["sft.num_kv_heads=0"], "sft.num_kv_heads must be > 0"),
        (["sft.intermediate_size=-1"], "sft.intermediate_size must be > 0"),
        (["sft.hidden_size=130"], "sft.hidden_size must be a multiple of sft.num_heads=4"),
        (["sft.hidden_size=132"], "sft.hidden_size must be a multiple of sft.num_heads=4 with an even"),
        (["sft.num_heads=6", "sft.hidden_size=192", "sft.num_kv_heads=4"], "sft.num_kv_heads must divide"),
    ],
)
def test_a_bad_tiny_model_shape_names_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_config(None, overrides)
    shape = load_config(None, ["sft.hidden_size=192", "sft.num_heads=6", "sft.num_kv_heads=3"]).sft
    assert (shape.hidden_size, shape.num_heads, shape.num_kv_heads) == (192, 6, 3)


def test_unknown_key_in_file_lists_valid_keys(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("rollout:\n  temprature: 0.7\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "rollout.temprature" in str(err.value) and "rollout.temperature" in str(err.value)


def test_missing_and_invalid_files(tmp_path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_parse_override_types() -> None:
    assert parse_override("a.b=3") == ("a.b", 3)
    assert parse_override("a.b=0.5") == ("a.b", 0.5)
    assert parse_override("a.b=true") == ("a.b", True)
    assert parse_override("a.b=x=y") == ("a.b", "x=y")
