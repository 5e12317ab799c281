"""Held-out accuracy: generate answers with the engine and score them (``evaluate``).

With a multi-turn workflow (``rollout.workflow=agent``) the workflow plays each held-out episode
itself (tools and all) and its group's rewards are the scores: single-turn generation and a verifier
cannot score a tool episode. The controller still knows nothing of turns: it calls the workflow.

Prompts whose ``meta`` names a kind under ``types.KIND_KEY`` (the calculator's problems:
``data.calculator.problem_kind``) are also reported kind by kind (``by_kind``), so that a gain on one kind
cannot hide the collapse of another; prompts without one (every other task) add nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from asyncrl.config import EvalConfig
from asyncrl.controller.metrics import tool_use_rates, trajectory_metrics
from asyncrl.rollout.api import RolloutEngine
from asyncrl.rollout.interruptible import generate_group
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.workflow import ScoreFn, Workflow
from asyncrl.types import KIND_KEY, Prompt, Trajectory

EvalResult = dict[str, Any]
"""What ``evaluate`` returns: numbers (``accuracy``, ``reward``, ``response_len``, tool-use rates) and, for
prompts with kinds, ``by_kind`` (``{kind: {prompts, accuracy, tool_call_hit_rate, episode_tool_call_frac,
...}}``)."""


async def evaluate(
    engine: RolloutEngine,
    prompts: Sequence[Prompt],
    score: ScoreFn,
    *,
    greedy: bool,
    temperature: float = 1.0,
    max_new_tokens: int,
    stop_token_ids: tuple[int, ...] = (),
    seed: int = 0,
    samples_per_prompt: int,
    workflow: Workflow | None = None,
) -> EvalResult:
    """Accuracy (fraction of reward 1.0), mean reward and mean response length on ``prompts``,
    averaged over ``samples_per_prompt`` samples each (1 when greedy: argmax is deterministic).
    ``greedy``, ``max_new_tokens`` and ``samples_per_prompt`` have no default: a run's are
    ``eval.*``, passed by :func:`eval_kwargs`. ``workflow``: play each prompt's episodes with it (a
    multi-turn one; response length: every token after the opening; its episodes' tool use is added,
    ``controller.metrics.trajectory_metrics``). Prompts with a non-empty string ``meta[KIND_KEY]`` (the
    calculator's) add ``by_kind``."""
    n = 1 if greedy else max(1, samples_per_prompt)
    sampling = SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        greedy=greedy,
        stop_token_ids=stop_token_ids,
        seed=seed,
    )

    async def one(prompt: Prompt) -> tuple[list[tuple[float, int]], tuple[Trajectory, ...]]:
        if workflow is not None:
            group = await workflow(engine, prompt, sampling, n, score, 0)
            scored = [(r, len(c.output_ids)) for r, c in zip(group.rewards, group.completions, strict=True)]
            return scored, group.trajectories
        completions = await generate_group(engine, prompt.token_ids, sampling, n)
        rewards = await asyncio.gather(*(score(prompt, c) for c in completions))
        return [(reward, len(c.output_ids)) for (reward, _failure), c in zip(rewards, completions, strict=True)], ()

    per_prompt = await asyncio.gather(*(one(p) for p in prompts))
    result: EvalResult = {
        **_scores([r for results, _ in per_prompt for r in results]),
        **trajectory_metrics([t for _, episodes in per_prompt for t in episodes]),
    }
    kinds = [kind if isinstance(kind := p.meta.get(KIND_KEY), str) and kind else None for p in prompts]
    if any(kinds):
        result["by_kind"] = by_kind(kinds, per_prompt)
    return result


def _scores(results: Sequence[tuple[float, int]]) -> dict[str, float]:
    total = max(1, len(results))
    return {
        "accuracy": sum(1 for r, _ in results if r >= 1.0) / total,
        "reward": sum(r for r, _ in results) / total,
        "response_len": sum(n_tok for _, n_tok in results) / total,
    }


_KIND_RATES = ("tool_call_hit_rate", "tool_call_malformed_rate", "episode_tool_call_frac")
"""The tool-use figures ``by_kind`` reports per kind (``controller.metrics.tool_use_rates``)."""


def by_kind(
    kinds: Sequence[str | None], per_prompt: Sequence[tuple[list[tuple[float, int]], tuple[Trajectory, ...]]]
) -> dict[str, dict[str, float]]:
    """Per kind (sorted; prompts without one left out): ``prompts``, ``accuracy`` (as the whole set's,
    over every sample), ``tool_call_hit_rate`` and ``tool_call_malformed_rate`` of its episodes (absent
    when none attempted a call: ``tool_use_rates``) and ``episode_tool_call_frac`` (the share of its
    episodes that call the tool; absent without episodes)."""
    out: dict[str, dict[str, float]] = {}
    for kind in sorted({k for k in kinds if k}):
        mine = [r for k, r in zip(kinds, per_prompt, strict=True) if k == kind]
        rates = tool_use_rates([t for _, episodes in mine for t in episodes])
        out[kind] = {
            "prompts": float(len(mine)),
            "accuracy": _scores([r for results, _ in mine for r in results])["accuracy"],
            **{k: rates[k] for k in _KIND_RATES if k in rates},
        }
    return out


def eval_kwargs(settings: EvalConfig, temperature: float, stop_token_ids: tuple[int, ...]) -> dict[str, Any]:
    """The keyword arguments of ``evaluate`` that a run's ``eval.*`` settings and its sampling ``temperature``
    (``rollout.temperature``) give (one place for the launcher's accuracy before/after and
    ``python -m benchmarks headline``'s snapshot evaluation)."""
    return {
        "greedy": settings.greedy,
        "temperature": temperature,
        "max_new_tokens": settings.max_new_tokens,
        "stop_token_ids": stop_token_ids,
        "samples_per_prompt": settings.samples_per_prompt,
    }
