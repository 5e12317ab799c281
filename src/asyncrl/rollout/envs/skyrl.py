"""The skyrl-gym adapter: a SkyRL text environment (``skyrl_gym.envs.BaseTextEnv``) played as an ``Environment``.

Owns ``agent.env=skyrl:<id or pkg.module:Class>``. skyrl-gym (0.4) environments are made per episode with the
episode's data (``extras``) and speak text: ``init(chat) -> (chat, metadata)`` opens the episode,
``step(action text) -> {observations, reward, done, metadata}`` answers each model turn, and the environment
parses its own tool calls out of the text (``<python>...</python>``, ``<search>...</search>``) and scores itself.
Each episode:

- makes the environment with ``skyrl_gym.make(id, env_config=..., extras=...)`` (an id of skyrl-gym's registry:
  its own ``gsm8k``, ``gsm8k_multi_turn``, ``aime``, ``lcb``, ``text2sql``, ``search``, ...) or calls the class
  ``pkg.module:Class`` with the same arguments. ``extras`` is what SkyRL's dataset rows carry:
  ``reward_spec: {method: rule, ground_truth: prompt.answer}`` and ``extra_info`` (the prompt's id and meta);
  ``env_config`` is empty (an OmegaConf node, as SkyRL hands it). An environment's own turn limit applies, and
  the workflow's ``agent.max_turns`` caps it;
- opens with ``init([{"role": "user", "content": question}])``: the chat it returns is the opening;
- hands ``step`` each model turn's whole text (without the end-of-turn token); the observations are the next
  messages (a ``tool`` role stays a tool message, anything else is a user turn) and ``done`` ends the episode;
- scores the episode with the sum of the step rewards (a turn-level env's format rewards and its final one add up).

Synchronous ``init``/``step``/``close`` run in a worker thread. Not carried over: ``postprocessed_action`` (the
trained ids are the model's own; a rewritten action would break token exactness) and ``get_metrics``.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from asyncrl.rollout.envs.base import EnvOptions, EnvReset, Message, ModelTurn, StepResult
from asyncrl.types import Prompt

__all__ = ["SkyRLEnv", "make_skyrl"]

_CLASS = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def _creator(target: str) -> Any:
    """A callable ``(env_config=, extras=) -> skyrl_gym.Env`` for ``target``; ValueError (one line) otherwise."""
    import skyrl_gym

    if _CLASS.fullmatch(target):
        from importlib.metadata import EntryPoint

        try:
            return EntryPoint(target, target, "skyrl").load()
        except (ImportError, AttributeError) as e:
            raise ValueError(f"agent.env=skyrl:{target}: cannot load it ({type(e).__name__}: {e})") from None
    if target not in skyrl_gym.registry:
        known = ", ".join(sorted(skyrl_gym.registry))
        raise ValueError(f"agent.env=skyrl:{target} is not a skyrl-gym id (registered: {known}) nor pkg.module:Class")
    return lambda **kwargs: skyrl_gym.make(target, **kwargs)


class SkyRLEnv:
    """One episode of a skyrl-gym text environment (see the module docstring)."""

    def __init__(self, target: str, creator: Any) -> None:
        self.target = target
        self.creator = creator
        self.env: Any = None

    def _make(self, prompt: Prompt) -> Any:
        import skyrl_gym
        from omegaconf import OmegaConf

        extras: dict[str, Any] = {
            "reward_spec": {"method": "rule", "ground_truth": prompt.answer},
            "extra_info": {"prompt_id": prompt.prompt_id, **{k: v for k, v in prompt.meta.items() if k != "question"}},
        }
        env = self.creator(env_config=OmegaConf.create({}), extras=extras)
        if not isinstance(env, skyrl_gym.Env):
            raise TypeError(f"agent.env=skyrl:{self.target} made a {type(env).__name__}, not a skyrl_gym.Env")
        return env

    async def reset(self, prompt: Prompt) -> EnvReset:
        question = prompt.meta.get("question")
        if not isinstance(question, str):
            raise ValueError(f"prompt {prompt.prompt_id}: a skyrl-gym environment needs meta['question']")
        self.env = await asyncio.to_thread(self._make, prompt)
        chat, _metadata = await asyncio.to_thread(self.env.init, [{"role": "user", "content": question}])
        return EnvReset(messages=tuple(Message(m["role"], str(m["content"])) for m in chat), scores=True)

    async def step(self, turn: ModelTurn) -> StepResult:
        if self.env is None:
            raise RuntimeError("SkyRLEnv.step before reset")
        out = await asyncio.to_thread(self.env.step, turn.text)
        observations = tuple(Message(m["role"], str(m["content"])) for m in out["observations"])
        kind = "tool" if any(m.role == "tool" for m in observations) else "user"
        done = bool(out["done"])
        return StepResult(messages=() if done else observations, done=done, reward=float(out["reward"]), kind=kind)

    async def close(self) -> None:
        if self.env is not None:
            await asyncio.to_thread(self.env.close)
            self.env = None


def make_skyrl(target: str, options: EnvOptions) -> SkyRLEnv:
    """One episode's ``Environment`` over the skyrl-gym environment ``target`` (see the module docstring)."""
    if not target:
        raise ValueError("agent.env=skyrl: needs a skyrl-gym id or pkg.module:Class, e.g. skyrl:gsm8k")
    return SkyRLEnv(target, _creator(target))
