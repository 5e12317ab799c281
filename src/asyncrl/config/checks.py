"""Validation of the config tree: choices, ranges and the settings that only work together.

``validate(cfg)`` is what :mod:`asyncrl.config` runs on every loaded or changed config. Every error is a
``ConfigError`` that names the one key at fault (a dotted key such as ``algo.kl_estimator``) and what it
may be: the valid values of a choice (from its ``Literal`` alias, ``config.parse.check_choices``), the
bound of a number, or the setting of another key it needs. No torch; of the config package, ``parse`` and ``tree``.

Numbers: every float of the tree (optional ones and tuples of floats included) must be finite
(``validate_finite``: ``nan`` and ``inf`` are refused wherever they are typed); every numeric key has one
range rule, in one of the tables below (``_BOUNDS``: a lower bound; ``_INTERVALS``: an interval; ``_SEEDS``:
a seed; ``_ANY_FINITE``: any finite value, with why) or in a named check of its own (``_CHECKED_APART``);
``ruled_keys()`` lists them all, and ``tests/test_config_fields.py`` holds that no numeric field is missing.
"""

from __future__ import annotations

import math
import re
import types
import typing
from dataclasses import fields, is_dataclass
from typing import Any, get_args

from asyncrl.choices import WorkflowName
from asyncrl.config.engine_checks import validate_backend, validate_launch
from asyncrl.config.parse import ConfigError, check_choices
from asyncrl.config.tree import Config

__all__ = [
    "allowed_range",
    "ruled_keys",
    "validate",
    "validate_algo",
    "validate_finite",
    "validate_fixed_lag",
    "validate_ranges",
    "validate_task",
    "validate_workflow",
]

_WORKFLOW_SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
_ENV_NAME = re.compile(r"[A-Za-z_][\w.-]*|(gym|skyrl|openenv):\S+")
"""``agent.env``'s form: a registered name or ``gym:...`` (or ``pkg.module:make``, ``_WORKFLOW_SPEC``); whether
the name is registered is known where the environment is built (``rollout.envs.registry``)."""
_GREATER = ">"
_AT_LEAST = ">="

_BOUNDS: dict[str, tuple[str, float, str]] = {
    # key: (comparison, bound, what the bound is for); a null optional value is never checked
    "task.train_size": (_AT_LEAST, 0, ""),
    "task.eval_size": (_GREATER, 0, ""),
    "task.max_terms": (_AT_LEAST, 2, ""),
    "task.max_operand": (_AT_LEAST, 1, ""),
    "reward.num_workers": (_GREATER, 0, ""),
    "reward.timeout_s": (_GREATER, 0, ""),
    "reward.max_retries": (_AT_LEAST, 0, ""),
    "rollout.group_size": (_GREATER, 0, ""),
    "rollout.temperature": (_GREATER, 0, " (use eval.greedy for argmax decoding)"),
    "rollout.top_k": (_AT_LEAST, 0, " (0: off)"),
    "rollout.max_new_tokens": (_GREATER, 0, ""),
    "rollout.max_prompt_len": (_GREATER, 0, ""),
    "rollout.max_slots": (_GREATER, 0, ""),
    "rollout.num_engines": (_AT_LEAST, 1, ""),
    "rollout.tensor_parallel_size": (_AT_LEAST, 1, ""),
    "rollout.gpu_memory_fraction": (_GREATER, 0, " or null (vLLM's default)"),
    "agent.max_turns": (_AT_LEAST, 1, ""),
    "agent.max_tokens": (_AT_LEAST, 1, ""),
    "agent.max_turn_tokens": (_AT_LEAST, 1, " or null"),
    "agent.malformed_penalty": (_AT_LEAST, 0, ""),
    "agent.tool_timeout_s": (_GREATER, 0, ""),
    "agent.tool_latency_median_s": (_GREATER, 0, ""),
    "agent.tool_latency_sigma": (_AT_LEAST, 0, " (0: every wait is the median)"),
    "algo.reward_scale": (_GREATER, 0, " (advantages are computed from rewards times it)"),
    "algo.eps_clip": (_AT_LEAST, 0, ""),
    "algo.eps_clip_high": (_AT_LEAST, 0, " or null"),
    "algo.dual_clip": (_GREATER, 1, " or null"),
    "algo.behav_cap": (_GREATER, 0, " or null (uncapped)"),
    "algo.max_version_gap": (_AT_LEAST, 0, " or null"),
    "algo.m2_threshold": (_AT_LEAST, 0, " or null"),
    "algo.kl_coef": (_AT_LEAST, 0, " (0: off)"),
    "algo.overlong_penalty": (_AT_LEAST, 0, ""),
    "trainer.lr": (_GREATER, 0, ""),
    "trainer.weight_decay": (_AT_LEAST, 0, " (0: off)"),
    "trainer.grad_clip": (_GREATER, 0, " (the largest gradient norm; 0 would zero every update)"),
    "trainer.warmup_steps": (_AT_LEAST, 0, " (0: none)"),
    "trainer.ppo_minibatches": (_GREATER, 0, ""),
    "trainer.max_tokens_per_micro_batch": (_GREATER, 0, ""),
    "trainer.padded_micro_batch_size": (_GREATER, 0, ""),
    "trainer.decay_steps": (_AT_LEAST, 0, " (0: the run's total steps)"),
    "trainer.broadcast_bucket_mb": (_GREATER, 0, ""),
    "trainer.lora_rank": (_AT_LEAST, 0, " (0: no LoRA)"),
    "trainer.lora_alpha": (_GREATER, 0, ""),
    "trainer.dist_timeout_s": (_GREATER, 0, ""),
    "controller.batch_size": (_GREATER, 0, ""),
    "controller.max_staleness": (_AT_LEAST, 0, ""),
    "controller.fixed_lag": (_AT_LEAST, 0, " or null"),
    "controller.max_concurrent": (_GREATER, 0, ""),
    "controller.high_water_batches": (_AT_LEAST, 0, " (0: off)"),
    "controller.total_steps": (_AT_LEAST, 0, ""),
    "controller.eval_every": (_AT_LEAST, 0, " (0: only before and after)"),
    "controller.snapshot_every_s": (_AT_LEAST, 0, " (0: off)"),
    "controller.max_rl_time_s": (_AT_LEAST, 0, " (0: no budget)"),
    "controller.checkpoint_every": (_AT_LEAST, 0, " (0: only at the end)"),
    "controller.keep_checkpoints": (_AT_LEAST, 2, " (a damaged newest checkpoint needs a previous one)"),
    "controller.episode_retries": (_AT_LEAST, 0, ""),
    "controller.episode_timeout_s": (_AT_LEAST, 0, " (0: none)"),
    "controller.max_engine_failures": (_AT_LEAST, 1, ""),
    "launch.ray_num_cpus": (_AT_LEAST, 0, " (0: this machine's cores)"),
    "launch.trainer_ranks": (_AT_LEAST, 1, ""),
    "launch.cpus_per_engine": (_AT_LEAST, 0, ""),
    "launch.gpus_per_engine": (_AT_LEAST, 0, ""),
    "launch.cpus_per_trainer": (_AT_LEAST, 0, ""),
    "launch.gpus_per_trainer": (_AT_LEAST, 0, ""),
    "launch.cpus_per_reward_worker": (_AT_LEAST, 0, ""),
    "launch.max_engine_restarts": (_AT_LEAST, 0, ""),
    "launch.startup_timeout_s": (_GREATER, 0, ""),
    "run.torch_threads": (_AT_LEAST, 0, " (0: torch's default)"),
    "eval.samples_per_prompt": (_GREATER, 0, ""),
    "eval.max_new_tokens": (_GREATER, 0, ""),
    "sft.steps": (_GREATER, 0, ""),
    "sft.batch_size": (_GREATER, 0, ""),
    "sft.lr": (_GREATER, 0, ""),
    "sft.warmup_steps": (_AT_LEAST, 0, ""),
    "sft.hidden_size": (_GREATER, 0, ""),
    "sft.num_layers": (_GREATER, 0, ""),
    "sft.num_heads": (_GREATER, 0, ""),
    "sft.num_kv_heads": (_GREATER, 0, ""),
    "sft.intermediate_size": (_GREATER, 0, ""),
    "sft.second_stage_steps": (_AT_LEAST, 0, " (0: one stage)"),
    "sft.second_stage_lr": (_GREATER, 0, ""),
    "sft.second_stage_warmup_steps": (_AT_LEAST, 0, ""),
    "sft.restart_check_step": (_AT_LEAST, 0, " (0: never)"),
    "sft.restart_loss_above": (_GREATER, 0, ""),
    "sft.max_restarts": (_AT_LEAST, 1, ""),
    "sft.stop_below_loss": (_AT_LEAST, 0, " (0: never)"),
}
"""The numeric keys with a lower bound."""

_INTERVALS: dict[str, str] = {
    "task.length_tail": "[0, 1]",
    "sft.teacher_slip_rate": "[0, 1]",
    "sft.tool_call_fraction": "[0, 1]",
    "sft.second_stage_tool_call_fraction": "[0, 1]",
    "rollout.top_p": "(0, 1]",
    "agent.reward_discount": "[0, 1]",
    "trainer.min_lr_ratio": "[0, 1]",
    "trainer.betas": "[0, 1)",
    "trainer.lora_dropout": "[0, 1)",
}
"""The keys that are fractions, with their interval within [0, 1] (a tuple: each of its values)."""

_SEED_MAX = 2**32 - 1
_SEEDS = ("task.seed", "sft.seed", "trainer.seed", "run.seed")
"""Seeds: in [0, 2**32 - 1] (what NumPy's global generator takes; ``launch.stages.seed_everything``)."""

_ANY_FINITE: dict[str, str] = {
    "algo.reward_bias": "a shift added to every reward",
}
"""The numeric keys any finite value of which is meaningful, with what they are."""

_CHECKED_APART: dict[str, str] = {
    "task.calculator_max_digits": "validate_ranges",
    "algo.overlong_buffer": "validate_algo",
}
"""The numeric keys whose range depends on their value or another key, with the check that holds it."""


def _value(cfg: Config, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def _in_interval(value: float, interval: str) -> bool:
    low_ok = value > 0 if interval[0] == "(" else value >= 0
    high_ok = value < 1 if interval[-1] == ")" else value <= 1
    return low_ok and high_ok


def ruled_keys() -> frozenset[str]:
    """Every numeric key that has a range rule (the tables of this module and the checks apart)."""
    return frozenset({*_BOUNDS, *_INTERVALS, *_SEEDS, *_ANY_FINITE, *_CHECKED_APART})


def allowed_range(key: str) -> str:
    """What ``key`` may be, as the errors say it (``"> 0"``, ``"in [0, 1]"``); empty for a key of no table."""
    if key in _BOUNDS:
        op, bound, note = _BOUNDS[key]
        return f"{op} {bound:g}{note}"
    if key in _INTERVALS:
        return f"in {_INTERVALS[key]}"
    if key in _SEEDS:
        return f"in [0, {_SEED_MAX}]"
    return ""


def _floats(annotation: Any) -> bool:
    """Whether a field of this annotation holds floats (``float``, ``float | None``, a tuple of floats)."""
    if annotation is float:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, tuple):
        return any(_floats(arg) for arg in typing.get_args(annotation))
    return False


def validate_finite(node: Any, prefix: str = "") -> None:
    """Every float of the dataclass tree ``node`` finite: ``nan`` and ``inf`` (which YAML and ``--set`` read
    as numbers) are refused by name wherever a float is typed, before any range is compared."""
    hints = typing.get_type_hints(type(node))
    for f in fields(node):
        value = getattr(node, f.name)
        key = f"{prefix}{f.name}"
        if is_dataclass(value):
            validate_finite(value, f"{key}.")
            continue
        if not _floats(hints[f.name]) or value is None:
            continue
        for x in value if isinstance(value, tuple) else (value,):
            if isinstance(x, float) and not math.isfinite(x):
                allowed = allowed_range(key)
                raise ConfigError(f"{key} must be a finite number{' ' + allowed if allowed else ''}, got {value}")


SFT_RESTART_FIELDS = ("restart_check_step", "restart_loss_above", "max_restarts")
"""The warm start's restart settings (``sft.*``); the first switches the others on."""


def validate_ranges(cfg: Config) -> None:
    """Every float finite (``validate_finite``), every number of ``_BOUNDS``, ``_INTERVALS`` and ``_SEEDS``
    within its range, and the ranges that depend on another key."""
    validate_finite(cfg)
    for key, (op, bound, note) in _BOUNDS.items():
        value = _value(cfg, key)
        if value is None:
            continue
        ok = value > bound if op == _GREATER else value >= bound
        if not ok:
            raise ConfigError(f"{key} must be {op} {bound:g}{note}, got {value}")
    for key, interval in _INTERVALS.items():
        value = _value(cfg, key)
        if not all(_in_interval(x, interval) for x in (value if isinstance(value, tuple) else (value,))):
            raise ConfigError(f"{key} must be in {interval}, got {value}")
    for key in _SEEDS:
        value = _value(cfg, key)
        if not 0 <= value <= _SEED_MAX:
            raise ConfigError(f"{key} must be in [0, {_SEED_MAX}], got {value}")
    digits = cfg.task.calculator_max_digits
    if digits != 0 and not 2 <= digits <= 7:
        raise ConfigError(f"task.calculator_max_digits must be 0 (the built-in ranges) or in [2, 7], got {digits}")
    if cfg.sft.tool_call_fraction != 1.0 and cfg.task.name != "calculator":
        raise ConfigError(
            f"sft.tool_call_fraction shapes the calculator's demonstrations only (task.name=calculator), got "
            f"{cfg.sft.tool_call_fraction} with task.name={cfg.task.name}"
        )
    _validate_second_stage(cfg)
    _validate_restart(cfg)
    sft = cfg.sft
    if sft.hidden_size % sft.num_heads or (sft.hidden_size // sft.num_heads) % 2:
        raise ConfigError(
            f"sft.hidden_size must be a multiple of sft.num_heads={sft.num_heads} with an even quotient (the head "
            f"size, rotated in pairs by RoPE), got {sft.hidden_size}"
        )
    if sft.num_heads % sft.num_kv_heads:
        raise ConfigError(
            f"sft.num_kv_heads must divide sft.num_heads={sft.num_heads} (grouped-query attention), "
            f"got {sft.num_kv_heads}"
        )


def _validate_second_stage(cfg: Config) -> None:
    """``sft.second_stage_*``: the calculator's only; its settings without its steps are a forgotten
    ``sft.second_stage_steps`` (a one-stage warm start in silence), refused."""
    sft, defaults = cfg.sft, type(cfg.sft)()
    if sft.second_stage_steps and cfg.task.name != "calculator":
        raise ConfigError(
            f"sft.second_stage_steps continues a calculator warm start on demonstrations that seldom call the tool "
            f"(task.name=calculator), got {sft.second_stage_steps} with task.name={cfg.task.name}"
        )
    if not sft.second_stage_steps:
        settings = (f.name for f in fields(sft) if f.name.startswith("second_stage_"))
        set_without = [f"sft.{k}" for k in settings if getattr(sft, k) != getattr(defaults, k)]
        if set_without:
            raise ConfigError(f"{', '.join(set_without)} set without sft.second_stage_steps (0: no second stage)")


def _validate_restart(cfg: Config) -> None:
    """``sft.restart_*``: a check step inside the stage (the check runs before a step, so the stage's last step
    is its last chance); the others without the check step refused (``sft.max_restarts`` >= 1 is a range)."""
    sft, defaults = cfg.sft, type(cfg.sft)()
    if not sft.restart_check_step:
        set_without = [f"sft.{k}" for k in SFT_RESTART_FIELDS[1:] if getattr(sft, k) != getattr(defaults, k)]
        if set_without:
            raise ConfigError(f"{', '.join(set_without)} set without sft.restart_check_step (0: never restart)")
        return
    if sft.restart_check_step >= sft.steps:
        raise ConfigError(
            f"sft.restart_check_step must be below sft.steps={sft.steps} (the stage it checks), got "
            f"{sft.restart_check_step}"
        )


def validate_algo(cfg: Config) -> None:
    """The settings of ``algo.*`` that depend on another key."""
    a = cfg.algo
    if a.m2_threshold is not None and a.prox_mode != "recompute":
        raise ConfigError(
            f"algo.m2_threshold needs algo.prox_mode=recompute (the mask is computed from the recomputed "
            f"proximal log-probs), got prox_mode={a.prox_mode}"
        )
    if not a.behav_weight and a.behav_cap is not None:
        raise ConfigError(
            f"algo.behav_weight=false leaves the behaviour weight out, so algo.behav_cap={a.behav_cap} has nothing "
            f"to cap: set algo.behav_cap=null"
        )
    if a.overlong_buffer < 0 or a.overlong_buffer > cfg.rollout.max_new_tokens:
        raise ConfigError(
            f"algo.overlong_buffer must be in [0, rollout.max_new_tokens={cfg.rollout.max_new_tokens}] (0: off), "
            f"got {a.overlong_buffer}"
        )
    if a.dual_clip is not None and a.loss_type in ("cispo", "pg"):
        raise ConfigError(f"algo.dual_clip does not apply to algo.loss_type={a.loss_type} (set it to null)")
    if a.advantage == "rloo" and cfg.rollout.group_size < 2:
        raise ConfigError(
            f"rollout.group_size must be >= 2 for algo.advantage=rloo (leave-one-out needs a second sample), "
            f"got {cfg.rollout.group_size}"
        )


def validate_fixed_lag(cfg: Config) -> None:
    """``controller.fixed_lag``: a lag k that the staleness bound allows, on the setups that hold a ring of
    in-process weight snapshots."""
    k = cfg.controller.fixed_lag
    if k is None:
        return
    needs = [
        (
            "controller.max_staleness",
            cfg.controller.max_staleness >= k,
            f" >= {k} (the bound the batcher checks)",
            cfg.controller.max_staleness,
        ),
        (
            "trainer.weight_transport",
            cfg.trainer.weight_transport == "tensors",
            "=tensors (it keeps the last k exports in memory)",
            cfg.trainer.weight_transport,
        ),
        ("launch.kind", cfg.launch.kind == "local", "=local", cfg.launch.kind),
        ("launch.engine_urls", not cfg.launch.engine_urls, " empty (engines of this process)", cfg.launch.engine_urls),
        (
            "controller.eval_every",
            cfg.controller.eval_every == 0,
            "=0 (an evaluation between steps would swap the engine's weights while the next batch generates)",
            cfg.controller.eval_every,
        ),
    ]
    if cfg.controller.adaptive:
        needs.append(("controller.adaptive", False, "=false (the lag sets staleness itself)", True))
    for key, ok, wanted, got in needs:
        if not ok:
            raise ConfigError(f"controller.fixed_lag={k} needs {key}{wanted}, got {got!r}")


def validate_workflow(cfg: Config) -> None:
    """``rollout.workflow``: a built-in name (``choices.WorkflowName``) or ``pkg.module:function``."""
    name = cfg.rollout.workflow
    if name not in get_args(WorkflowName) and not _WORKFLOW_SPEC.fullmatch(name):
        raise ConfigError(
            f"rollout.workflow must be one of {', '.join(get_args(WorkflowName))} or pkg.module:function, got {name!r}"
        )
    entry = cfg.agent.entrypoint
    if name == "openai_agent" and (entry is None or not _WORKFLOW_SPEC.fullmatch(entry)):
        raise ConfigError(f"rollout.workflow=openai_agent needs agent.entrypoint=pkg.module:function, got {entry!r}")
    env = cfg.agent.env
    if not (_ENV_NAME.fullmatch(env) or _WORKFLOW_SPEC.fullmatch(env)):
        raise ConfigError(
            f"agent.env must be a registered environment name, gym:..., skyrl:..., openenv:... or pkg.module:make, "
            f"got {env!r}"
        )
    if cfg.agent.tool_latency != "none" and name != "agent":
        raise ConfigError(
            f"agent.tool_latency={cfg.agent.tool_latency} needs rollout.workflow=agent (the waits are added to "
            f"its environments' steps), got rollout.workflow={name!r}"
        )
    if cfg.agent.episode_mode != "linear" and name != "openai_agent":
        raise ConfigError(
            f"agent.episode_mode={cfg.agent.episode_mode} needs rollout.workflow=openai_agent (it shapes the door's "
            f"recorded completions into samples), got rollout.workflow={name!r}"
        )


def validate_task(cfg: Config) -> None:
    """``task.name=reasoning_gym`` and ``task.verifier=reasoning_gym`` go together (the verifier scores with
    the entry the task puts in each prompt); the task needs ``task.datasets``. ``task.name=verifiers`` (a
    verifiers taskset, ``task.datasets``) goes with ``rollout.workflow=agent agent.env=verifiers``."""
    task = cfg.task
    if task.name == "reasoning_gym" and not task.datasets:
        raise ConfigError("task.name=reasoning_gym needs task.datasets=NAME[,NAME...] (reasoning-gym dataset names)")
    if task.name == "reasoning_gym" and task.verifier == "arithmetic":
        raise ConfigError(
            "task.name=reasoning_gym is scored by its datasets' own score_answer: set task.verifier=reasoning_gym"
        )
    if task.verifier == "reasoning_gym" and task.name != "reasoning_gym":
        raise ConfigError(f"task.verifier=reasoning_gym needs task.name=reasoning_gym, got task.name={task.name}")
    if task.name == "verifiers" and not task.datasets:
        raise ConfigError("task.name=verifiers needs task.datasets=<verifiers taskset id> (an installed module)")
    if task.name == "verifiers" and (cfg.rollout.workflow != "agent" or cfg.agent.env != "verifiers"):
        raise ConfigError(
            "task.name=verifiers is played and scored by its tasks: set rollout.workflow=agent agent.env=verifiers"
        )
    if cfg.agent.env == "verifiers" and cfg.rollout.workflow == "agent" and task.name != "verifiers":
        raise ConfigError(f"agent.env=verifiers plays task.name=verifiers prompts, got task.name={task.name}")


def validate(cfg: Config) -> Config:
    """Check choices, ranges and the keys that depend on each other; return ``cfg``."""
    check_choices(cfg, "")
    validate_workflow(cfg)
    validate_task(cfg)
    validate_ranges(cfg)
    validate_algo(cfg)
    validate_fixed_lag(cfg)
    validate_launch(cfg)
    validate_backend(cfg)
    return cfg
