"""The config tree as one source of truth: every field documented, every choice one ``Literal`` alias shared
with the functions that take it, every error naming the one key at fault, and the tree frozen."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import types
import typing
from pathlib import Path

import pytest

import asyncrl.choices as choices
from asyncrl import config as config_module
from asyncrl.algo.advantages import compute_advantages
from asyncrl.algo.aggregation import aggregate_loss
from asyncrl.algo.logprobs import kl_penalty
from asyncrl.algo.losses import policy_loss
from asyncrl.config import AlgoConfig, Config, ConfigError, RolloutConfig, load_config, validate, with_values
from asyncrl.config import checks as config_checks
from asyncrl.controller.staleness import StalenessGate
from asyncrl.rollout.engine import LocalEngine
from asyncrl.trainer.packing import split_micro_batches

CONFIG_SOURCE = Path(config_module.__file__).parent
CONFIG_SOURCES = tuple(CONFIG_SOURCE / name for name in ("tree.py", "agent.py", "learn.py"))


def _fields_without_docstring(source: str) -> list[str]:
    """``Class.field`` for every annotated field of a class in ``source`` not followed by a string."""
    missing = []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for i, statement in enumerate(node.body):
            if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
                continue
            following = node.body[i + 1] if i + 1 < len(node.body) else None
            documented = (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
                and following.value.value.strip()
            )
            if not documented:
                missing.append(f"{node.name}.{statement.target.id}")
    return missing


def test_every_config_field_has_a_docstring() -> None:
    for source in CONFIG_SOURCES:
        assert _fields_without_docstring(source.read_text()) == [], source.name


def test_the_docstring_check_finds_an_undocumented_field() -> None:
    source = 'class A:\n    x: int = 1\n    """documented"""\n    y: int = 2\n    z: int = 3\n    ""\n'
    assert _fields_without_docstring(source) == ["A.y", "A.z"]


# ------------------------------------------------------------------------------------------ choices
def _leaf_fields(node: object, prefix: str = "") -> dict[str, object]:
    """Dotted key -> annotation of every leaf field of the config tree."""
    out: dict[str, object] = {}
    hints = typing.get_type_hints(type(node))
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            out.update(_leaf_fields(value, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = hints[f.name]
    return out


def _aliases() -> dict[str, object]:
    return {name: getattr(choices, name) for name in choices.__all__ if typing.get_origin(getattr(choices, name))}


def test_every_choice_field_is_typed_by_an_alias_of_asyncrl_choices() -> None:
    """Each ``Literal`` field's annotation is an alias of ``asyncrl.choices`` and each alias types a field;
    a new ``str`` field must be free text (listed here) or get an alias."""
    aliases = _aliases()
    literal_fields = {k: a for k, a in _leaf_fields(Config()).items() if typing.get_origin(a) is typing.Literal}
    used = set()
    for key, annotation in literal_fields.items():
        names = [name for name, alias in aliases.items() if annotation == alias]
        assert names, f"{key} is typed by a Literal that is not an alias of asyncrl.choices"
        used.update(names)
    used.add("WorkflowName")  # rollout.workflow: a built-in name or pkg.module:function (config.checks)
    assert used == set(aliases), f"aliases that type no config field: {sorted(set(aliases) - used)}"
    str_fields = [k for k, a in _leaf_fields(Config()).items() if a is str]
    # free text: paths, module names, URLs (no fixed set of values)
    assert sorted(str_fields) == [
        "agent.env",
        "launch.engine_urls",
        "model.device",
        "rollout.sglang_urls",
        "rollout.workflow",
        "sft.cache_dir",
        "task.verifier",
        "trainer.lora_target_modules",
    ]


@pytest.mark.parametrize(
    ("key", "alias"),
    [
        ("algo.advantage", choices.AdvantageEstimator),
        ("algo.loss_type", choices.LossType),
        ("algo.kl_estimator", choices.KLEstimator),
        ("rollout.interrupt_mode", choices.InterruptMode),
        ("controller.high_water_unit", choices.HighWaterUnit),
        ("trainer.balance", choices.BalanceMethod),
        ("launch.placement_strategy", choices.PlacementStrategy),
    ],
)
def test_a_bad_choice_names_the_key_and_every_value_of_its_alias(key: str, alias: object) -> None:
    valid = typing.get_args(alias)
    for value in valid:  # every value of the alias loads (the alias is the whole list)
        if key == "launch.placement_strategy":
            load_config(None, ["launch.kind=ray", f"{key}={value}"])
        else:
            load_config(None, [f"{key}={value}"])
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"{key}=nope"])
    assert str(err.value) == f"{key}: 'nope' is not one of {', '.join(valid)}"


def test_a_config_built_in_code_is_checked_against_the_aliases_too() -> None:
    cfg = dataclasses.replace(Config(), algo=AlgoConfig(loss_type="reinforce"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^algo\.loss_type: 'reinforce' is not one of ppo, gspo, cispo, pg$"):
        validate(cfg)


@pytest.mark.parametrize(
    ("function", "parameter", "alias"),
    [
        (compute_advantages, "estimator", choices.AdvantageEstimator),
        (policy_loss, "loss_type", choices.LossType),
        (policy_loss, "behav_cap_mode", choices.BehavCapMode),
        (policy_loss, "behav_cap_level", choices.BehavCapLevel),
        (policy_loss, "aggregation", choices.Aggregation),
        (aggregate_loss, "aggregation", choices.Aggregation),
        (kl_penalty, "kind", choices.KLEstimator),
        (split_micro_batches, "method", choices.BalanceMethod),
        (LocalEngine.__init__, "interrupt_mode", choices.InterruptMode),
    ],
)
def test_the_functions_take_the_same_alias_as_the_config(function: object, parameter: str, alias: object) -> None:
    hints = typing.get_type_hints(function)
    assert hints[parameter] == alias


def test_the_staleness_gate_checks_its_unit_against_the_alias() -> None:
    assert typing.get_type_hints(StalenessGate)["high_water_unit"] == choices.HighWaterUnit
    with pytest.raises(ValueError, match="unknown high_water_unit 'tokens'; valid choices: groups, samples"):
        StalenessGate(batch_size=1, max_staleness=0, max_concurrent=1, high_water_unit="tokens")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------- defaults
def test_library_knobs_that_disagreed_with_the_config_have_no_default() -> None:
    """behav_cap (None vs 5.0) and the engine's size (64 slots vs 128) live only in the config."""
    assert inspect.signature(policy_loss).parameters["behav_cap"].default is inspect.Parameter.empty
    engine = inspect.signature(LocalEngine.__init__).parameters
    assert engine["max_slots"].default is inspect.Parameter.empty
    assert engine["max_seq_len"].default is inspect.Parameter.empty
    assert (AlgoConfig().behav_cap, RolloutConfig().max_slots) == (5.0, 128)


# ----------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["controller.eval_every=-1"], "controller.eval_every must be >= 0 (0: only before and after), got -1"),
        (["controller.high_water_batches=-2"], "controller.high_water_batches must be >= 0 (0: off), got -2"),
        (["controller.episode_timeout_s=-1"], "controller.episode_timeout_s must be >= 0 (0: none), got -1.0"),
        (["controller.max_engine_failures=0"], "controller.max_engine_failures must be >= 1, got 0"),
        (["trainer.decay_steps=-1"], "trainer.decay_steps must be >= 0 (0: the run's total steps), got -1"),
        (["trainer.min_lr_ratio=1.5"], "trainer.min_lr_ratio must be in [0, 1], got 1.5"),
        (["rollout.top_p=0"], "rollout.top_p must be in (0, 1], got 0.0"),
        (["launch.gpus_per_trainer=-1"], "launch.gpus_per_trainer must be >= 0, got -1.0"),
        (["launch.max_engine_restarts=-1"], "launch.max_engine_restarts must be >= 0, got -1"),
        (["algo.overlong_penalty=-1"], "algo.overlong_penalty must be >= 0, got -1.0"),
        (
            ["algo.overlong_buffer=500"],
            "algo.overlong_buffer must be in [0, rollout.max_new_tokens=160] (0: off), got 500",
        ),
        (["rollout.num_engines=2"], "rollout.num_engines must be 1 with launch.kind=local"),
        (["launch.trainer_ranks=2"], "launch.trainer_ranks must be 1 with launch.kind=local"),
        (
            ["launch.kind=ray", "launch.engine_mode=server"],
            "launch.weight_sync must be disk with launch.engine_mode=server (servers load weights from a path), got "
            "object_store",
        ),
        (["algo.advantage=rloo", "rollout.group_size=1"], "rollout.group_size must be >= 2 for algo.advantage=rloo"),
        (
            ["controller.fixed_lag=1", "launch.engine_urls=http://x"],
            "controller.fixed_lag=1 needs launch.engine_urls empty",
        ),
    ],
)
def test_each_error_names_the_one_key_at_fault(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert str(err.value).startswith(message), str(err.value)


# ----------------------------------------------------------------------------------------- ranges
def _numeric(annotation: object) -> bool:
    """Whether a field of this annotation holds numbers (int, float, optional or a tuple of them)."""
    if annotation in (int, float):
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, tuple):
        return any(_numeric(arg) for arg in typing.get_args(annotation))
    return False


def _holds_floats(annotation: object) -> bool:
    if annotation is float:
        return True
    return typing.get_origin(annotation) in (typing.Union, types.UnionType, tuple) and any(
        _holds_floats(arg) for arg in typing.get_args(annotation)
    )


NUMERIC_KEYS = sorted(k for k, a in _leaf_fields(Config()).items() if _numeric(a))
FLOAT_KEYS = sorted(k for k, a in _leaf_fields(Config()).items() if _holds_floats(a))


def test_every_numeric_field_has_a_range_rule() -> None:
    """A new number of the tree gets a rule in ``config.checks`` (a bound, an interval, a seed, any finite
    value with why, or a check of its own), and no rule names a key that is gone."""
    assert len(NUMERIC_KEYS) > 80
    assert set(NUMERIC_KEYS) - config_checks.ruled_keys() == set()
    assert config_checks.ruled_keys() - set(NUMERIC_KEYS) == set()


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=str)
def test_every_float_refuses_nan_and_inf_by_name(key: str, bad: float) -> None:
    default = _value_of(Config(), key)
    value = (bad, *default[1:]) if isinstance(default, tuple) else bad
    with pytest.raises(ConfigError) as err:
        with_values(Config(), {key: value})
    assert str(err.value).startswith(f"{key} must be a finite number"), str(err.value)
    assert str(bad) in str(err.value)


def _value_of(cfg: object, key: str) -> object:
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def _just_outside(key: str) -> object:
    """A value just outside ``key``'s rule in the tables of ``config.checks``."""
    default = _value_of(Config(), key)
    integer = isinstance(default, int) or (default is None and _leaf_fields(Config())[key] == int | None)
    if key in config_checks._BOUNDS:
        op, bound, _ = config_checks._BOUNDS[key]
        if op == ">":
            return int(bound) if integer else float(bound)
        return int(bound) - 1 if integer else bound - 0.5
    if key in config_checks._SEEDS:
        return -1
    interval = config_checks._INTERVALS[key]
    bad = 0.0 if interval[0] == "(" else 1.0 if interval[-1] == ")" else 1.5
    return (default[0], bad) if isinstance(default, tuple) else bad


RULED_BY_TABLE = sorted({*config_checks._BOUNDS, *config_checks._INTERVALS, *config_checks._SEEDS})


@pytest.mark.parametrize("key", RULED_BY_TABLE)
def test_every_table_rule_refuses_the_value_just_outside_it(key: str) -> None:
    bad = _just_outside(key)
    with pytest.raises(ConfigError) as err:
        with_values(Config(), {key: list(bad) if isinstance(bad, tuple) else bad})
    message = str(err.value)
    assert message.startswith(f"{key} must be {config_checks.allowed_range(key)}, got "), message
    assert "\n" not in message


# ----------------------------------------------------------------------------------------- frozen
def test_a_loaded_config_is_frozen_and_with_values_makes_a_checked_copy() -> None:
    cfg = load_config(None, ["controller.batch_size=4"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.controller.batch_size = 8  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.controller = cfg.controller  # type: ignore[misc]
    changed = with_values(cfg, {"controller.batch_size": 8, "model.path": "ckpt"})
    assert (changed.controller.batch_size, changed.model.path) == (8, "ckpt")
    assert (cfg.controller.batch_size, cfg.model.path) == (4, None)
    assert changed.rollout is cfg.rollout  # untouched sections are shared, not copied
    with pytest.raises(ConfigError, match="controller.batch_size must be > 0, got 0"):
        with_values(cfg, {"controller.batch_size": 0})
    with pytest.raises(ConfigError, match="controller.batch_size: expected an integer"):
        with_values(cfg, {"controller.batch_size": "eight"})
