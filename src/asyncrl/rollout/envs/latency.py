"""Simulated tool latency: a seeded wait before an environment answers a turn that calls a tool.

Owns ``ToolLatency`` (the distribution of one call's wait: ``none`` or ``lognormal`` with a median and
a sigma, ``agent.tool_latency*``) and ``DelayedTools``, the ``Environment`` that wraps another one and,
for a turn with well-formed calls, draws one wait per call and sleeps for the longest (a turn's calls
run concurrently) before handing the turn on. The wait is ``await asyncio.sleep``: a waiting episode
never blocks the engine or other episodes. Turns without a call (answers, malformed calls only) are
answered at once.

Reproducible: ``ToolLatency.stream(prompt_id, episode)`` is a ``random.Random`` seeded by the run's
seed, the prompt and the episode's index in its group, so the same episode draws the same waits in
every run and every retry, whatever the order episodes run in (``AgentWorkflow`` makes one per
episode).
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass

from asyncrl.choices import ToolLatencyDist, check_choice
from asyncrl.rollout.envs.base import Environment, EnvReset, ModelTurn, StepResult
from asyncrl.types import Prompt

__all__ = ["DelayedTools", "ToolLatency"]


@dataclass(frozen=True)
class ToolLatency:
    """The wait of one tool call (``agent.tool_latency``, ``tool_latency_median_s``, ``tool_latency_sigma``)."""

    dist: ToolLatencyDist = "none"
    median_s: float = 0.2
    """The median wait (seconds)."""
    sigma: float = 1.0
    """Sigma of the log of the wait (``lognormal``); 0: every wait is the median."""
    seed: int = 0
    """The run's seed (``run.seed``), mixed into every episode's stream."""

    def __post_init__(self) -> None:
        check_choice(self.dist, ToolLatencyDist, "tool latency distribution")
        if not self.median_s > 0 or not self.sigma >= 0:
            raise ValueError(f"ToolLatency: median_s must be > 0 and sigma >= 0, got {self.median_s}, {self.sigma}")

    @property
    def active(self) -> bool:
        """Whether any wait is added (``none``: no)."""
        return self.dist != "none"

    def stream(self, prompt_id: str, episode: int) -> random.Random:
        """The seeded stream of waits of episode ``episode`` of the group of ``prompt_id``."""
        return random.Random(f"tool-latency/{self.seed}/{prompt_id}/{episode}")

    def draw(self, rng: random.Random) -> float:
        """One call's wait in seconds."""
        match self.dist:
            case "none":
                return 0.0
            case "lognormal":
                return self.median_s * math.exp(self.sigma * rng.gauss(0.0, 1.0))


class DelayedTools:
    """An ``Environment`` whose turns with tool calls wait ``latency`` first (see the module docstring)."""

    def __init__(self, env: Environment, latency: ToolLatency, rng: random.Random) -> None:
        self.env = env
        self.latency = latency
        self.rng = rng

    async def reset(self, prompt: Prompt) -> EnvReset:
        return await self.env.reset(prompt)

    async def step(self, turn: ModelTurn) -> StepResult:
        if turn.parsed.calls:
            await asyncio.sleep(max(self.latency.draw(self.rng) for _ in turn.parsed.calls))
        return await self.env.step(turn)

    async def close(self) -> None:
        await self.env.close()
