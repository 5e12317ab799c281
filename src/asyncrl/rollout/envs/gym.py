"""The gym-style adapter: a text environment with ``reset``/``step`` plugged in as an ``Environment``.

A ``TextGym`` is what users of gym-style text environments already have: ``reset(prompt) ->
observation`` and ``step(action) -> (observation, reward, done)`` over strings, with synchronous or
async methods. ``GymAdapter`` opens the episode with the first observation as a user turn, hands
each model turn's whole text to ``step`` as the action, and shows each observation as the next user
turn (``role``). Synchronous methods run in a worker thread, so a slow one never blocks the
engine. The episode's reward is the sum of the step rewards (the adapter scores its episodes).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from asyncrl.rollout.envs.base import EnvReset, Message, ModelTurn, StepResult
from asyncrl.types import Prompt

__all__ = ["GymAdapter", "TextGym"]


@runtime_checkable
class TextGym(Protocol):
    """A gym-style text environment (methods may be plain or ``async``)."""

    def reset(self, prompt: Prompt) -> Any:
        """-> the first observation (str)."""
        ...

    def step(self, action: str) -> Any:
        """-> (observation: str, reward: float, done: bool)."""
        ...


async def _call(fn: Any, *args: Any) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    return await asyncio.to_thread(fn, *args)


class GymAdapter:
    """``Environment`` over a ``TextGym`` (see the module docstring)."""

    def __init__(self, gym: TextGym, *, role: str = "user", close: Callable[[], Any] | None = None) -> None:
        """``close``: called (sync or async) when the episode ends, e.g. ``gym.close``."""
        self.gym = gym
        self.role = role
        self._close = close

    async def reset(self, prompt: Prompt) -> EnvReset:
        observation = await _call(self.gym.reset, prompt)
        return EnvReset(messages=(Message(self.role, str(observation)),), scores=True)

    async def step(self, turn: ModelTurn) -> StepResult:
        observation, reward, done = await _call(self.gym.step, turn.text)
        messages = () if done else (Message(self.role, str(observation)),)
        return StepResult(messages=messages, done=bool(done), reward=float(reward), kind="user")

    async def close(self) -> None:
        if self._close is not None:
            await _call(self._close)
