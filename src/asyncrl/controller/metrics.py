"""The per-step metrics of the controller (one line of ``metrics.jsonl``, from a typed ``StepRecord``) and
the timeline sample (one line of ``timeline.jsonl``)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from asyncrl.controller.state import ControllerState
from asyncrl.trainer.api import TrainStepResult
from asyncrl.types import Group, Trajectory


@dataclass(frozen=True)
class StepTimes:
    """Where the time around one training step went (seconds)."""

    train_start_s: float
    """RL time (``ControllerState.rl_elapsed_s``'s clock) at which the trainer began the step."""
    end_s: float
    """RL time at which the step was recorded."""
    wall_s: float
    """Wall time since the previous step was recorded (the first: since the train loop began)."""
    wait_s: float
    """Waiting for a fresh batch."""
    train_s: float
    """Batching and the training step (on the trainer's executor)."""
    sync_s: float
    """Exporting the new weights and loading them into the engine (draining it first in ``drain`` mode)."""
    checkpoint_s: float
    """Checkpoints saved since the previous step was recorded."""


@dataclass(frozen=True)
class StepRecord:
    """Everything one line of ``metrics.jsonl`` is computed from (``step_metrics``)."""

    step: int
    groups: list[Group]
    """The groups trained (or skipped) at this step."""
    result: TrainStepResult
    trained_tokens: int
    """Tokens of the step's samples."""
    times: StepTimes
    engine_before: dict[str, float]
    """``engine.stats()`` when the previous step was recorded."""
    engine_after: dict[str, float]
    """``engine.stats()`` now."""
    generated_during_train: float
    """Tokens the engine generated while the trainer stepped."""
    state: ControllerState
    """The run's counters after this step (totals)."""
    buffer_groups: int
    running_groups: int
    reward_latency_s: list[float]
    """Every reward call since the previous step."""
    rollout_rewards: list[float]
    """Every scored sample since the previous step (those of filtered groups too)."""

    @property
    def staleness(self) -> list[int]:
        """Per group: this step minus the oldest version of any of its tokens."""
        return [self.step - g.min_version for g in self.groups]


def step_metrics(record: StepRecord) -> dict[str, Any]:
    """Reward, throughput, staleness, queue and loss metrics of one training step."""
    rewards = [x for g in record.groups for x in g.rewards]
    interruptions = [comp.num_interruptions for g in record.groups for comp in g.completions]
    latency = sorted(record.reward_latency_s)
    rollout = record.rollout_rewards
    staleness = record.staleness
    times, before, after, state = record.times, record.engine_before, record.engine_after, record.state
    wall = times.wall_s
    metrics: dict[str, Any] = {
        "step": record.step,
        "version": record.result.version,
        "time_s": times.end_s,
        "train_start_s": times.train_start_s,
        "reward": sum(rewards) / len(rewards),
        "accuracy": sum(1 for x in rewards if x >= 1.0) / len(rewards),
        "rollout_reward": sum(rollout) / len(rollout) if rollout else None,
        "rollout_accuracy": sum(1 for x in rollout if x >= 1.0) / len(rollout) if rollout else None,
        "rollout_samples": len(rollout),
        "response_len": sum(len(comp.output_ids) for g in record.groups for comp in g.completions) / len(rewards),
        "trained_tokens": record.trained_tokens,
        "trained_tokens_per_s": state.trained_tokens / max(times.end_s, 1e-9),
        "trained_tokens_per_s_step": record.trained_tokens / max(wall, 1e-9),
        "generated_tokens_per_s": (after["generated_tokens"] - before["generated_tokens"]) / wall,
        "generated_tokens_during_train": record.generated_during_train,
        "engine_busy_frac": min(1.0, (after["busy_s"] - before["busy_s"]) / wall)
        if "busy_s" in after and "busy_s" in before
        else None,  # an engine that does not report its busy time (an SGLang server)
        "engine_slot_occupancy": slot_occupancy(before, after),
        "trainer_busy_frac": min(1.0, (times.train_s + times.sync_s) / wall),
        "step_wall_s": wall,
        "wait_for_batch_s": times.wait_s,
        "train_step_s": times.train_s,
        "weight_sync_s": times.sync_s,
        "checkpoint_s": times.checkpoint_s,
        "staleness_mean": sum(staleness) / len(staleness),
        "staleness_max": max(staleness),
        "staleness_hist": dict(Counter(staleness)),
        "interruptions_per_sample": sum(interruptions) / len(interruptions),
        "buffer_groups": record.buffer_groups,
        "running_groups": record.running_groups,
        "engine_waiting_requests": after.get("waiting_requests", 0.0),
        "admitted_total": state.admitted,
        "filtered_groups_total": state.filtered_groups,
        "stale_groups_total": state.stale_groups,
        "engine_failures_total": state.engine_failures,
        "episode_retries_total": state.episode_retries,
        "reward_latency_p50_s": latency[len(latency) // 2] if latency else 0.0,
        "reward_latency_p99_s": latency[min(len(latency) - 1, int(0.99 * len(latency)))] if latency else 0.0,
        "applied": record.result.applied,
    }
    metrics.update(episode_metrics(record.groups))
    metrics.update({k: v for k, v in record.result.metrics.items() if k not in metrics})
    if not math.isfinite(metrics.get("loss", 0.0)):
        metrics["loss"] = None
    return metrics


def slot_occupancy(before: dict[str, float], after: dict[str, float]) -> float | None:
    """Share of the engine's decode slots busy in its decode steps between two ``stats()``: tokens
    decoded / (slots x decode steps); None when the engine reports no decode counters or did not decode.
    A pool (``rollout.pool.EnginePool``) sums its engines' counters and slots and says how many
    ``engines`` it has: slots per engine x the decode steps of all engines."""
    keys = ("decode_tokens", "decode_steps", "max_slots")
    if not all(k in before and k in after for k in keys):
        return None
    steps = after["decode_steps"] - before["decode_steps"]
    slots = after["max_slots"] / max(1.0, after.get("engines", 1.0))
    if steps <= 0 or slots <= 0:
        return None
    return min(1.0, (after["decode_tokens"] - before["decode_tokens"]) / (slots * steps))


def episode_metrics(groups: list[Group]) -> dict[str, float]:
    """Multi-turn samples of the step (groups with ``trajectories``; none: {}): turns, tool calls, tool
    errors and malformed calls per episode, tool latency, the share of environment tokens, and the
    rates of tool use (``tool_use_rates``)."""
    return trajectory_metrics([t for g in groups for t in g.trajectories])


def trajectory_metrics(episodes: Sequence[Trajectory]) -> dict[str, float]:
    """``episode_metrics`` of a list of episodes (a step's samples, or a held-out evaluation's)."""
    if not episodes:
        return {}
    turns = [turn for t in episodes for turn in t.turns]
    n, tokens = len(episodes), sum(len(t.loss_mask) for t in episodes)
    return {
        "episode_turns_mean": len(turns) / n,
        "episode_tool_calls_mean": sum(len(turn.tool_calls) for turn in turns) / n,
        "episode_tool_errors_mean": sum(turn.tool_errors for turn in turns) / n,
        "episode_malformed_mean": sum(turn.malformed for turn in turns) / n,
        "episode_tool_latency_mean_s": sum(turn.tool_latency_s for turn in turns) / max(1, len(turns)),
        "episode_env_token_frac": (tokens - sum(sum(t.loss_mask) for t in episodes)) / max(1, tokens),
        **tool_use_rates(episodes),
    }


def tool_use_rates(episodes: Sequence[Trajectory]) -> dict[str, float]:
    """Rates over the attempted calls (well-formed + malformed) of ``episodes``; absent when none was
    attempted (a rate of nothing is not 0):

    - ``tool_call_correct_rate``: calls that parsed, named a known tool and ran without error;
    - ``tool_call_malformed_rate``: calls that did not parse;
    - ``tool_call_hit_rate``: correct calls whose result was what the task needed (the calculator: the
      reference answer), where the environment can tell (``TurnRecord.tool_hits``).

    Over the episodes (present whenever there are episodes): ``episode_tool_call_frac``, the share that
    attempted at least one call (well-formed or malformed), which the rates above cannot show (a policy
    that stops calling keeps its hit rate); ``episode_tool_hit_frac``, the share with at least one hit
    (only where the environment tells hits)."""
    turns = [turn for t in episodes for turn in t.turns]
    calls = sum(len(turn.tool_calls) for turn in turns)
    malformed = sum(turn.malformed for turn in turns)
    rates: dict[str, float] = {}
    if episodes:
        calling = sum(1 for t in episodes if any(turn.tool_calls or turn.malformed for turn in t.turns))
        rates["episode_tool_call_frac"] = calling / len(episodes)
    if calls + malformed:
        rates["tool_call_correct_rate"] = (calls - sum(turn.tool_errors for turn in turns)) / (calls + malformed)
        rates["tool_call_malformed_rate"] = malformed / (calls + malformed)
    if any(turn.tool_hits is not None for turn in turns):  # the environment tells (a turn cut short cannot)
        if calls + malformed:
            rates["tool_call_hit_rate"] = sum(turn.tool_hits or 0 for turn in turns) / (calls + malformed)
        hit = sum(1 for t in episodes if any(turn.tool_hits for turn in t.turns))
        rates["episode_tool_hit_frac"] = hit / len(episodes)
    return rates


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
    """One line of ``timeline.jsonl``: what each component is doing at RL time ``t``.
    ``engine_running_sample_s`` (where the engine counts it): the integral of its running samples over
    time, from which occupancy between two lines is exact (``sim.validate``)."""
    sample = {
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
    if "running_sample_s" in engine_stats:
        sample["engine_running_sample_s"] = engine_stats["running_sample_s"]
    return sample
