"""The per-step metrics record of the controller (one line of ``metrics.jsonl``) and the timeline sample."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from asyncrl.controller.state import ControllerState
from asyncrl.trainer.api import TrainStepResult
from asyncrl.types import Group


def step_metrics(
    step: int,
    groups: list[Group],
    result: TrainStepResult,
    staleness: list[int],
    trained_tokens: int,
    engine_now: dict[str, float],
    last_engine: dict[str, float],
    wall: float,
    *,
    now: float,
    state: ControllerState,
    buffer_groups: int,
    running_groups: int,
    reward_latency: list[float],
    rollout_rewards: list[float],
    checkpoint_s: float,
    train_start: float,
    wait_s: float,
    train_s: float,
    sync_s: float,
    gen_during: float,
) -> dict[str, Any]:
    """Reward, throughput, staleness, queue and loss metrics of one training step."""
    rewards = [r for g in groups for r in g.rewards]
    interruptions = [comp.num_interruptions for g in groups for comp in g.completions]
    latency = sorted(reward_latency)
    rollout = rollout_rewards
    record: dict[str, Any] = {
        "step": step,
        "version": result.version,
        "time_s": now,
        "train_start_s": train_start,
        "reward": sum(rewards) / len(rewards),
        "accuracy": sum(1 for r in rewards if r >= 1.0) / len(rewards),
        "rollout_reward": sum(rollout) / len(rollout) if rollout else None,
        "rollout_accuracy": sum(1 for r in rollout if r >= 1.0) / len(rollout) if rollout else None,
        "rollout_samples": len(rollout),
        "response_len": sum(len(comp.output_ids) for g in groups for comp in g.completions) / len(rewards),
        "trained_tokens": trained_tokens,
        "trained_tokens_per_s": state.trained_tokens / max(now, 1e-9),
        "trained_tokens_per_s_step": trained_tokens / max(wall, 1e-9),
        "generated_tokens_per_s": (engine_now["generated_tokens"] - last_engine["generated_tokens"]) / wall,
        "generated_tokens_during_train": gen_during,
        "engine_busy_frac": min(1.0, (engine_now["busy_s"] - last_engine["busy_s"]) / wall)
        if "busy_s" in engine_now and "busy_s" in last_engine
        else None,  # an engine that does not report its busy time (an SGLang server)
        "trainer_busy_frac": min(1.0, (train_s + sync_s) / wall),
        "wait_for_batch_s": wait_s,
        "train_step_s": train_s,
        "weight_sync_s": sync_s,
        "checkpoint_s": checkpoint_s,
        "staleness_mean": sum(staleness) / len(staleness),
        "staleness_max": max(staleness),
        "staleness_hist": dict(Counter(staleness)),
        "interruptions_per_sample": sum(interruptions) / len(interruptions),
        "buffer_groups": buffer_groups,
        "running_groups": running_groups,
        "engine_waiting_requests": engine_now.get("waiting_requests", 0.0),
        "admitted_total": state.admitted,
        "filtered_groups_total": state.filtered_groups,
        "stale_groups_total": state.stale_groups,
        "engine_failures_total": state.engine_failures,
        "episode_retries_total": state.episode_retries,
        "reward_latency_p50_s": latency[len(latency) // 2] if latency else 0.0,
        "reward_latency_p99_s": latency[min(len(latency) - 1, int(0.99 * len(latency)))] if latency else 0.0,
        "applied": result.applied,
    }
    record.update({k: v for k, v in result.metrics.items() if k not in record})
    if not math.isfinite(record.get("loss", 0.0)):
        record["loss"] = None
    return record


def timeline_sample(
    t: float,
    engine_stats: dict[str, float],
    *,
    trainer_busy: bool,
    checkpointing: bool,
    reward_in_flight: int,
    buffer_groups: int,
    running_groups: int,
    version: int,
    generating_samples: int = 0,
) -> dict[str, Any]:
    """One line of ``timeline.jsonl``: what each component is doing at RL time ``t``."""
    return {
        "t": t,
        "engine_running": engine_stats.get("running_samples", 0.0),
        "engine_waiting": engine_stats.get("waiting_requests", 0.0),
        "engine_generated_tokens": engine_stats.get("generated_tokens", 0.0),
        "engine_decode_s": engine_stats.get("decode_s", 0.0),
        "engine_prefill_s": engine_stats.get("prefill_s", 0.0),
        "engine_update_s": engine_stats.get("update_s", 0.0),
        "engine_prefill_tokens": engine_stats.get("prefill_tokens", 0.0),
        "trainer_busy": trainer_busy,
        "checkpointing": checkpointing,
        "reward_in_flight": reward_in_flight,
        "buffer_groups": buffer_groups,
        "running_groups": running_groups,
        "generating_samples": generating_samples,
        "version": version,
    }
