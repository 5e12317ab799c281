"""The gym-style adapter: a text environment with ``reset``/``step`` plugged in as an ``Environment``.

A ``TextGym`` is what users of gym-style text environments already have: ``reset(prompt) ->
observation`` and ``step(action) -> (observation, reward, done)`` over strings, with synchronous or
async methods. ``GymAdapter`` opens the episode with the first observation as a user turn, hands
each model turn's whole text to ``step`` as the action, and shows each observation as the next user
turn (``role``). Synchronous methods run in a worker thread, so a slow one never blocks the
engine. The episode's reward is the sum of the step rewards (the adapter scores its episodes).

``GymnasiumText`` is the ``TextGym`` of a ``gymnasium.Env`` whose observations and actions are text
(``agent.env=gym:<id or pkg.module:Class>``, ``make_gymnasium``): ``reset`` is called with a seed drawn from
the run's seed and the prompt's id (every episode of a group sees the same instance) and ``options`` holding
the prompt's ``prompt_id``, ``question`` and ``answer`` (an environment may pose the prompt or ignore it);
``step`` takes the turn's text and ends the episode when the environment terminates or truncates.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from asyncrl.rollout.envs.base import EnvOptions, EnvReset, Message, ModelTurn, StepResult
from asyncrl.types import Prompt

if TYPE_CHECKING:
    import gymnasium

__all__ = ["GymAdapter", "GymnasiumText", "TextGym", "make_gymnasium"]


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


def episode_seed(run_seed: int, prompt_id: str) -> int:
    """The seed of ``reset`` for ``prompt_id`` in a run seeded ``run_seed`` (stable across processes)."""
    digest = hashlib.blake2b(f"gym/{run_seed}/{prompt_id}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def _text(env: Any, observation: Any) -> str:
    if not isinstance(observation, str):
        raise TypeError(f"{type(env).__name__} observed {type(observation).__name__}, not text (a spaces.Text)")
    return observation


class GymnasiumText:
    """A ``TextGym`` over a ``gymnasium.Env`` with text observations and actions (see the module docstring)."""

    def __init__(self, env: gymnasium.Env, seed: int = 0) -> None:
        """``seed``: the run's seed, mixed with each prompt's id into the seed of ``reset``."""
        self.env = env
        self.seed = seed

    def reset(self, prompt: Prompt) -> str:
        options = {"prompt_id": prompt.prompt_id, "question": prompt.meta.get("question"), "answer": prompt.answer}
        observation, _info = self.env.reset(seed=episode_seed(self.seed, prompt.prompt_id), options=options)
        return _text(self.env, observation)

    def step(self, action: str) -> tuple[str, float, bool]:
        observation, reward, terminated, truncated, _info = self.env.step(action)
        return _text(self.env, observation), float(reward), bool(terminated or truncated)

    def close(self) -> None:
        self.env.close()


_CLASS = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def make_gymnasium(target: str, options: EnvOptions) -> GymAdapter:
    """One episode's ``Environment`` over the Gymnasium environment ``target``: ``pkg.module:Class`` (a
    ``gymnasium.Env`` subclass, or a function returning one, called with no arguments), else a registered
    Gymnasium id (``gymnasium.make``)."""
    from importlib.metadata import EntryPoint

    import gymnasium

    if _CLASS.fullmatch(target):
        try:
            env = EntryPoint(target, target, "gym").load()()
        except (ImportError, AttributeError) as e:
            raise ValueError(f"agent.env=gym:{target}: cannot load it ({type(e).__name__}: {e})") from None
    else:
        try:
            env = gymnasium.make(target)
        except gymnasium.error.Error as e:
            raise ValueError(f"agent.env=gym:{target}: {type(e).__name__}: {e}") from None
    if not isinstance(env, gymnasium.Env):
        raise ValueError(f"agent.env=gym:{target} made a {type(env).__name__}, not a gymnasium.Env")
    gym = GymnasiumText(env, options.seed)
    return GymAdapter(gym, close=gym.close)
