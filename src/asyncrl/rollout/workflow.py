"""Workflows: one episode as an async function (render is done by data/; here: generate, score).

``Workflow`` (a Protocol: the seam between the controller and rollout, beside ``api.RolloutEngine``)
is the call the controller makes per prompt; ``run_episode`` is single-turn RLVR: G
samples of one prompt from the engine (interruptible: aborted samples are resumed under the new
weights), then every sample scored by the ``score`` callable the controller hands in. A workflow imports no reward code.

The multi-turn workflows (``agent.AgentWorkflow``, ``openai_workflow.OpenAIAgentWorkflow``) share the
two ends of a group of episodes: ``episode_samplings`` (each episode its own seed) and
``group_of_episodes`` (their ``ScoredEpisode`` results as one ``Group``).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from asyncrl.rollout.api import RolloutEngine, SampleDone
from asyncrl.rollout.interruptible import generate_group
from asyncrl.rollout.sampling import SEED_MOD, SamplingParams
from asyncrl.types import Completion, Group, Prompt, Trajectory

ScoreFn = Callable[[Prompt, Completion], Awaitable[tuple[float, str | None]]]
"""(prompt, completion) -> (reward, failure reason or None)."""


class Workflow(Protocol):
    """What the controller calls per admitted prompt (positionally), and all it knows of an episode:
    ``run_episode`` itself (single-turn RLVR), an ``agent.AgentWorkflow`` (multi-turn tool use), an
    ``openai_workflow.OpenAIAgentWorkflow`` (an agent written against an OpenAI client), or a user's
    ``pkg.module:function`` with this signature (``rollout.workflow``)."""

    async def __call__(
        self,
        engine: RolloutEngine,
        prompt: Prompt,
        sampling: SamplingParams,
        group_size: int,
        score: ScoreFn,
        start_version: int,
        on_sample_done: SampleDone | None = None,
    ) -> Group:
        """``group_size`` episodes of ``prompt`` on ``engine`` (admitted at ``start_version``), each scored
        with ``score``; ``on_sample_done(i)`` as episode ``i`` ends (the admission gate's live count)."""
        ...


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


@dataclass(frozen=True)
class ScoredEpisode:
    """One multi-turn episode of a group, as its workflow scored it."""

    trajectory: Trajectory
    reward: float
    """The reward trained on (the environment's, the agent's or the verifier's, less any penalty)."""
    failure: str | None
    """Why the verifier could not score it (None: it did, or it was not asked)."""


def episode_samplings(sampling: SamplingParams, group_size: int) -> list[SamplingParams]:
    """Each episode's sampling: episode ``i`` seeded ``base + i`` (mod ``SEED_MOD``), ``base`` the
    sampling's seed (a seeded group replays) or else a fresh random one (episodes of a group differ)."""
    base = sampling.seed if sampling.seed is not None else random.getrandbits(31)
    return [replace(sampling, seed=(base + i) % SEED_MOD) for i in range(group_size)]


def group_of_episodes(prompt: Prompt, episodes: Sequence[ScoredEpisode], start_version: int) -> Group:
    """The ``Group`` of ``prompt``'s episodes, in their order: each trajectory, its completion (what the
    trainer packs), its reward and its scoring failure."""
    trajectories = tuple(e.trajectory for e in episodes)
    completions: tuple[Completion, ...] = tuple(t.to_completion() for t in trajectories)
    return Group(
        prompt=prompt,
        completions=completions,
        rewards=tuple(e.reward for e in episodes),
        start_version=start_version,
        reward_failures=tuple(e.failure for e in episodes),
        trajectories=trajectories,
    )
