"""The config tree (typed dataclasses), its loading (YAML, ``--set`` overrides) and its validation.

``tree``: the sections and ``Config``; ``agent`` and ``learn``: the agent, algorithm and trainer sections;
``parse``: YAML values into typed fields, unknown keys and choices named; ``checks``: ranges and the
settings that only work together; ``load``: ``load_config`` and ``with_values`` (defaults, YAML files,
overrides, validated once). No torch; nothing of the project but ``choices``. ``docs/config.md`` is the
generated reference of every field.
"""

from asyncrl.config.agent import AgentConfig
from asyncrl.config.checks import validate
from asyncrl.config.learn import AlgoConfig, TrainerConfig
from asyncrl.config.load import dump_yaml, load_config, to_dict, with_values
from asyncrl.config.parse import ConfigError, parse_override
from asyncrl.config.tree import (
    Config,
    ControllerConfig,
    EvalConfig,
    LaunchConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    SFTConfig,
    TaskConfig,
)

__all__ = [
    "AgentConfig",
    "AlgoConfig",
    "Config",
    "ConfigError",
    "ControllerConfig",
    "EvalConfig",
    "LaunchConfig",
    "ModelConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "SFTConfig",
    "TaskConfig",
    "TrainerConfig",
    "dump_yaml",
    "load_config",
    "parse_override",
    "to_dict",
    "validate",
    "with_values",
]
