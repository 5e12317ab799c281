"""Workflows: one episode as an async function (render is done by data/; here: generate, score).

``Workflow`` is the call the controller makes per prompt; ``run_episode`` is single-turn RLVR: G
samples of one prompt from the engine (interruptible: aborted samples are resumed under the new
weights), then every sample scored by the ``score`` callable the controller hands in. A workflow imports no reward code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from asyncrl.rollout.api import RolloutEngine, SampleDone
from asyncrl.rollout.interruptible import generate_group
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Completion, Group, Prompt

ScoreFn = Callable[[Prompt, Completion], Awaitable[tuple[float, str | None]]]
"""(prompt, completion) -> (reward, failure reason or None)."""

Workflow = Callable[..., Awaitable[Group]]
"""What the controller calls per admitted prompt: ``run_episode``'s signature (engine, prompt, sampling,
group_size, score, start_version, on_sample_done) -> ``Group``; ``run_episode`` itself, an
``agent.AgentWorkflow``, or a user's ``pkg.module:function`` (``rollout.workflow``)."""


async def run_episode(
    engine: RolloutEngine,
    prompt: Prompt,
    sampling: SamplingParams,
    group_size: int,
    score: ScoreFn,
    start_version: int,
    on_sample_done: SampleDone | None = None,
) -> Group:
    """Generate ``group_size`` completions of ``prompt`` and score each one (``on_sample_done``: see
    ``generate_group``)."""
    completions = await generate_group(engine, prompt.token_ids, sampling, group_size, on_sample_done)
    results = await asyncio.gather(*(score(prompt, c) for c in completions))
    return Group(
        prompt=prompt,
        completions=tuple(completions),
        rewards=tuple(float(r) for r, _ in results),
        start_version=start_version,
        reward_failures=tuple(f for _, f in results),
    )
