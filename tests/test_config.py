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


# ------------------------------------------------------------------------------ ranges of numbers
ISSUE_EXAMPLES = [  # issue 31: each passed check-config, then train died with a traceback
    ("trainer.lr=nan", "trainer.lr must be a finite number > 0, got nan"),
    ("trainer.lr=-1", "trainer.lr must be > 0, got -1.0"),
    ("trainer.grad_clip=-1", "trainer.grad_clip must be > 0"),
    ("trainer.weight_decay=-5", "trainer.weight_decay must be >= 0 (0: off), got -5.0"),
    ("algo.reward_scale=nan", "algo.reward_scale must be a finite number > 0"),
]

ONE_PER_RULE = [  # a value just outside each rule added with them, and each kind of rule
    ("trainer.lr=0", "trainer.lr must be > 0, got 0.0"),
    ("trainer.lr=.inf", "trainer.lr must be a finite number > 0, got inf"),
    ("trainer.lr=-inf", "trainer.lr must be a finite number > 0, got -inf"),
    ("trainer.grad_clip=0", "trainer.grad_clip must be > 0"),
    ("trainer.warmup_steps=-1", "trainer.warmup_steps must be >= 0"),
    ("trainer.lora_alpha=0", "trainer.lora_alpha must be > 0"),
    ("trainer.lora_dropout=1", "trainer.lora_dropout must be in [0, 1), got 1.0"),
    ("trainer.betas=[0.9, 1.0]", "trainer.betas must be in [0, 1), got (0.9, 1.0)"),
    ("trainer.betas=[-0.1, 0.9]", "trainer.betas must be in [0, 1)"),
    ("trainer.betas=[nan, 0.9]", "trainer.betas must be a finite number in [0, 1), got (nan, 0.9)"),
    ("algo.reward_scale=0", "algo.reward_scale must be > 0"),
    ("algo.reward_scale=-1", "algo.reward_scale must be > 0"),
    ("algo.reward_bias=nan", "algo.reward_bias must be a finite number, got nan"),
    ("algo.behav_cap=.inf", "algo.behav_cap must be a finite number > 0 or null"),
    ("algo.eps_clip=nan", "algo.eps_clip must be a finite number >= 0"),
    ("sft.steps=0", "sft.steps must be > 0"),
    ("sft.batch_size=0", "sft.batch_size must be > 0"),
    ("sft.lr=-0.001", "sft.lr must be > 0"),
    ("sft.warmup_steps=-1", "sft.warmup_steps must be >= 0"),
    ("run.torch_threads=-2", "run.torch_threads must be >= 0"),
    ("run.seed=-1", "run.seed must be in [0, 4294967295], got -1"),
    ("task.seed=4294967296", "task.seed must be in [0, 4294967295]"),
    ("trainer.seed=-3", "trainer.seed must be in [0, 4294967295]"),
    ("sft.seed=-1", "sft.seed must be in [0, 4294967295]"),
    ("reward.timeout_s=inf", "reward.timeout_s must be a finite number > 0, got inf"),
    ("controller.max_rl_time_s=.inf", "controller.max_rl_time_s must be a finite number >= 0"),
    ("rollout.temperature=nan", "rollout.temperature must be a finite number > 0"),
    ("rollout.top_p=0", "rollout.top_p must be in (0, 1], got 0.0"),
    ("rollout.top_p=1.5", "rollout.top_p must be in (0, 1]"),
    ("task.length_tail=nan", "task.length_tail must be a finite number in [0, 1]"),
    ("launch.cpus_per_engine=-1", "launch.cpus_per_engine must be >= 0"),
    ("agent.tool_timeout_s=0", "agent.tool_timeout_s must be > 0"),
]


@pytest.mark.parametrize(("override", "message"), ISSUE_EXAMPLES + ONE_PER_RULE, ids=lambda x: x)
def test_a_number_out_of_range_is_one_error_naming_key_value_and_range(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    text = str(err.value)
    assert message in text and "\n" not in text
    assert text.startswith(override.split("=")[0])  # the key first


@pytest.mark.parametrize(
    "override",
    [
        "trainer.weight_decay=0",
        "trainer.lora_dropout=0",
        "trainer.betas=[0, 0.999]",
        "algo.reward_bias=-1",
        "run.seed=4294967295",
        "task.seed=0",
        "run.torch_threads=0",
        "trainer.warmup_steps=0",
        "trainer.lr=1e-6",
        "rollout.top_p=1",
        "algo.reward_scale=0.01",
        "trainer.grad_clip=1e-3",
        "algo.behav_cap=null",
    ],
)
def test_a_number_at_the_edge_of_its_range_is_accepted(override: str) -> None:
    load_config(None, [override])


def test_check_config_refuses_a_nan_in_one_line_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from asyncrl.cli import main

    assert main(["check-config", "--set", "trainer.lr=nan"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "asyncrl: config error: trainer.lr must be a finite number > 0, got nan\n"
