"""Held-out accuracy: generate answers with the engine and score them (``evaluate``).

With a multi-turn workflow (``rollout.workflow=agent``) the workflow plays each held-out episode
itself (tools and all) and its group's rewards are the scores: single-turn generation and a verifier
cannot score a tool episode. The controller still knows nothing of turns: it calls the workflow."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from asyncrl.config import Config
from asyncrl.controller.metrics import trajectory_metrics
from asyncrl.rollout.api import RolloutEngine
from asyncrl.rollout.interruptible import generate_group
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.workflow import ScoreFn, Workflow
from asyncrl.types import Prompt, Trajectory


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
) -> dict[str, float]:
    """Accuracy (fraction of reward 1.0), mean reward and mean response length on ``prompts``,
    averaged over ``samples_per_prompt`` samples each (1 when greedy: argmax is deterministic).
    ``greedy``, ``max_new_tokens`` and ``samples_per_prompt`` have no default: a run's are
    ``eval.*``, passed by :func:`eval_kwargs`. ``workflow``: play each prompt's episodes with it (a
    multi-turn one; response length: every token after the opening; its episodes' tool use is added,
    ``controller.metrics.trajectory_metrics``)."""
    n = 1 if greedy else max(1, samples_per_prompt)
    sampling = SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        greedy=greedy,
        stop_token_ids=stop_token_ids,
        seed=seed,
    )

    episodes: list[Trajectory] = []

    async def one(prompt: Prompt) -> list[tuple[float, int]]:
        if workflow is not None:
            group = await workflow(engine, prompt, sampling, n, score, 0)
            episodes.extend(group.trajectories)
            return [(r, len(c.output_ids)) for r, c in zip(group.rewards, group.completions, strict=True)]
        completions = await generate_group(engine, prompt.token_ids, sampling, n)
        scored = await asyncio.gather(*(score(prompt, c) for c in completions))
        return [(reward, len(c.output_ids)) for (reward, _failure), c in zip(scored, completions, strict=True)]

    results = [r for group in await asyncio.gather(*(one(p) for p in prompts)) for r in group]
    total = max(1, len(results))
    return {
        "accuracy": sum(1 for r, _ in results if r >= 1.0) / total,
        "reward": sum(r for r, _ in results) / total,
        "response_len": sum(n_tok for _, n_tok in results) / total,
        **trajectory_metrics(episodes),
    }


def eval_kwargs(cfg: Config, stop_token_ids: tuple[int, ...]) -> dict[str, Any]:
    """The keyword arguments of ``evaluate`` that a run's ``eval.*`` settings give (one place for
    the launcher's accuracy before/after and ``asyncrl bench headline``'s snapshot evaluation)."""
    return {
        "greedy": cfg.eval.greedy,
        "temperature": cfg.rollout.temperature,
        "max_new_tokens": cfg.eval.max_new_tokens,
        "stop_token_ids": stop_token_ids,
        "samples_per_prompt": cfg.eval.samples_per_prompt,
    }
