"""Every set of choices of the config, each defined once as a ``Literal`` alias (DESIGN §2).

The alias is the type of its config field (``asyncrl.config``) and of the parameters of the functions
that take the choice (``algo.policy_loss(loss_type=...)``, ``LocalEngine(interrupt_mode=...)``, ...);
both validate against it with ``typing.get_args``, so adding a value is a one-line change here (and a
``case`` where it is dispatched). A leaf module: it imports nothing of the project, so the config and
the pure stages (``algo``) can both import it.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = [
    "AdvantageEstimator",
    "Aggregation",
    "ArithmeticForm",
    "BalanceMethod",
    "BehavCapLevel",
    "BehavCapMode",
    "DType",
    "EpisodeMode",
    "EngineMode",
    "HighWaterUnit",
    "InterruptMode",
    "KLEstimator",
    "LaunchKind",
    "LRSchedule",
    "LossType",
    "MicroBatching",
    "PlacementStrategy",
    "Precision",
    "ProxMode",
    "RayWeightSync",
    "RolloutBackend",
    "StragglerPolicy",
    "TaskName",
    "ToolFormat",
    "ToolLatencyDist",
    "WeightSyncMode",
    "WeightTransport",
    "WorkflowName",
    "check_choice",
    "choice_error",
]

# model / task
DType = Literal["float32", "bfloat16", "float16"]
"""``model.dtype``: the dtype weights are loaded in (``models.load_policy``)."""
TaskName = Literal["arithmetic", "calculator", "gsm8k", "humaneval", "jsonl", "reasoning_gym", "verifiers"]
"""``task.name``: the prompt source (``data.prompts.build_task``)."""
ArithmeticForm = Literal["chain", "repeat"]
"""``task.form``: the problem forms of the synthetic arithmetic task (``data.synthetic``)."""

# rollout / controller
RolloutBackend = Literal["local", "vllm", "sglang"]
"""``rollout.backend``: the engine behind ``rollout.api.RolloutEngine`` (``launch.stages.build_engine``): ``local``
(``rollout.engine.LocalEngine``), ``vllm`` (``rollout.vllm_engine.VLLMEngine``, vLLM's ``AsyncLLM``) or ``sglang``
(``rollout.sglang_engine.SGLangEngine``, a client of running SGLang servers)."""
InterruptMode = Literal["abort", "keep"]
"""``rollout.interrupt_mode``: what an in-flight weight update does to running requests (``LocalEngine``)."""
HighWaterUnit = Literal["groups", "samples"]
"""``controller.high_water_unit``: what a running group weighs under the high-water mark (``StalenessGate``)."""
StragglerPolicy = Literal["drop", "wait"]
"""``controller.stragglers``: what the trainer does about a group that may finish after its last trainable
step (``controller.loop``): drop it once stale, or wait for it (``staleness.must_wait_for_stragglers``)."""
WeightSyncMode = Literal["inflight", "drain"]
"""``controller.weight_sync``: whether an update waits for running episodes (``controller.loop``)."""
WorkflowName = Literal["single_turn", "agent", "openai_agent"]
"""``rollout.workflow``'s built-in workflows (``launch.stages.build_workflow``); the field also takes a
``pkg.module:function`` with ``rollout.workflow.run_episode``'s signature."""

# agent (multi-turn episodes)
ToolFormat = Literal["hermes", "tag", "json", "qwen3", "qwen3_coder", "mistral", "deepseek_v3", "deepseek_r1"]
"""``agent.tool_format``: how tool calls (and, for ``qwen3`` and ``deepseek_r1``, the ``<think>`` reasoning) are
written in a model turn, by model family (``rollout.tools.parse_tool_calls``; docs/agent.md lists them)."""
ToolLatencyDist = Literal["none", "lognormal"]
"""``agent.tool_latency``: the simulated wait of a tool call (``rollout.envs.latency.ToolLatency``)."""
EpisodeMode = Literal["linear", "tree", "individual"]
"""``agent.episode_mode``: what an ``openai_agent`` episode's recorded completions train as
(``rollout.openai_tree``): one conversation, one sample (``linear``); every branch of the prefix tree, one sample
each (``tree``); every completion, one sample each (``individual``)."""

# algo
AdvantageEstimator = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"]
"""``algo.advantage``: the group advantage estimator (``algo.advantages.compute_advantages``)."""
LossType = Literal["ppo", "gspo", "cispo", "pg"]
"""``algo.loss_type``: the policy-loss variant (``algo.losses.policy_loss``)."""
ProxMode = Literal["recompute", "loglinear", "behav"]
"""``algo.prox_mode``: where the proximal log-probs come from (``trainer.Trainer``)."""
BehavCapMode = Literal["mask", "clamp"]
"""``algo.behav_cap_mode``: what the behaviour-weight cap does (``algo.losses.policy_loss``)."""
BehavCapLevel = Literal["token", "sequence"]
"""``algo.behav_cap_level``: what the behaviour-weight cap looks at (``algo.losses.policy_loss``)."""
KLEstimator = Literal["k1", "k2", "k3"]
"""``algo.kl_estimator``: Schulman's KL estimators (``algo.logprobs.kl_penalty``)."""
Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]
"""``algo.aggregation``: how token losses become one number (``algo.aggregation.aggregate_loss``)."""

# trainer
MicroBatching = Literal["packed", "padded", "padded_grouped"]
"""``trainer.micro_batching``: how a batch is cut into micro-batches (``trainer.Trainer``)."""
BalanceMethod = Literal["ffd", "kk"]
"""``trainer.balance``: how sequences are binned (``trainer.packing``)."""
LRSchedule = Literal["constant", "linear", "cosine"]
"""``trainer.lr_schedule``: the LR after warm-up (``trainer.bookkeeping.lr_factor``)."""
Precision = Literal["auto", "fp32", "bf16"]
"""``trainer.precision``: mixed precision or not (``trainer.Trainer``)."""
WeightTransport = Literal["tensors", "safetensors"]
"""``trainer.weight_transport``: how ``export_weights`` hands weights over (``trainer.state``)."""

# launch
LaunchKind = Literal["local", "ray"]
"""``launch.kind``: which launcher runs the stages (``launch.local``, ``launch.ray``)."""
PlacementStrategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
"""``launch.placement_strategy``: Ray's placement-group strategy (``launch.ray``)."""
RayWeightSync = Literal["object_store", "disk"]
"""``launch.weight_sync``: how the Ray trainer ships weights to engines (``launch.ray_actors``)."""
EngineMode = Literal["actor", "server"]
"""``launch.engine_mode``: Ray engines called directly or over HTTP (``launch.ray``)."""


def choice_error(value: object, choices: object, what: str) -> ValueError:
    """The error for ``value`` outside the ``Literal`` alias ``choices``: it names ``what`` and every
    valid value (for the ``case _:`` of a ``match`` over a choice)."""
    return ValueError(f"unknown {what} {value!r}; valid choices: {', '.join(map(str, get_args(choices)))}")


def check_choice(value: object, choices: object, what: str) -> None:
    """Raise :func:`choice_error` unless ``value`` is one of the ``Literal`` alias ``choices`` (for
    library entry points, which may be called with any string)."""
    if value not in get_args(choices):
        raise choice_error(value, choices, what)
