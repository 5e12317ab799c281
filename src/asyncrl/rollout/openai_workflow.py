"""The ``openai_agent`` workflow: a user's agent, written against the ``openai`` client, trained through the door.

Owns one group of such episodes. Per call (one prompt, G episodes) the workflow starts a ``DoorServer``
over the engine handle it is given (bound to 127.0.0.1, a key generated per workflow), opens one
session per episode with the run's sampling (episode ``i`` seeded ``seed + i``) and token budget, and
runs the agent's entrypoint once per session:

    entrypoint(base_url, api_key, task) -> float | None

``base_url`` is the session's (``http://127.0.0.1:<port>/sessions/<id>/v1``: an unmodified
``openai.OpenAI(base_url=..., api_key=...)`` carries the session; the door answers to any ``model``
name, so an agent written for another model runs as it is), ``task`` a plain dict
(``prompt_id``, ``question``, ``answer``, ``meta``). A plain function runs in a worker thread (the
``openai`` client blocks), an ``async def`` on the event loop. The episode's reward is what the
entrypoint returns, else the reward it sent to ``POST /sessions/<id>/end``, else the run's verifier
(the ``score`` callable) on the flattened trajectory. An agent that raises after at least one call
is scored on what it did (and the error logged); one that made no call fails the group.

Each session becomes a ``Trajectory`` (``rollout.openai_session``: the ids the engine was given and
produced, environment glue out of the loss), so the controller trains the G sessions of a prompt like
any group: group-relative advantages, staleness from the oldest model token. With ``episode_mode`` tree or
individual (``rollout.openai_tree``) a session takes any history and concurrent calls, and an episode
yields one sample per branch or per completion, each with its own reward (the completion's own, set through
``/reward``, else the episode's discounted by ``reward_discount``): the group then holds every sample of
its G episodes (``Group.episodes`` says whose), and its advantages are relative over those samples (GRPO:
each sample's reward against the mean of the group's samples). Each call's tokens are
capped by ``max_turn_tokens`` (else the sampling's ``max_new_tokens``): an agent's larger
``max_tokens`` is lowered to it, a smaller one kept. The controller knows
nothing of this beyond calling the workflow (``launch.stages.build_workflow``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from asyncrl.auth import new_api_key
from asyncrl.choices import EpisodeMode
from asyncrl.rollout.api import RolloutEngine, SampleDone
from asyncrl.rollout.openai_door import MAX_REQUEST_CHARS, ChatDoor, DoorServer
from asyncrl.rollout.openai_session import ChatSession
from asyncrl.rollout.openai_tree import episode_samples
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.tools import ToolFormat
from asyncrl.rollout.workflow import ScoredEpisode, ScoreFn, episode_samplings, group_of_episodes
from asyncrl.types import Group, Prompt, Trajectory

__all__ = ["AgentEntrypoint", "DoorSettings", "OpenAIAgentWorkflow", "task_dict"]

log = logging.getLogger(__name__)

AgentEntrypoint = Callable[[str, str, dict[str, Any]], "float | None | Awaitable[float | None]"]
"""``(base_url, api_key, task) -> reward or None``; plain or ``async def``."""


@dataclass(frozen=True)
class DoorSettings:
    """How the workflow's sessions are bounded and read."""

    tool_format: ToolFormat = "hermes"
    """How tool calls in model text become ``tool_calls`` (``rollout.tools``)."""
    max_tokens: int = 256
    """Tokens per session after its opening (model and glue); a call past it gets 400."""
    max_turn_tokens: int | None = None
    """The most tokens per call (a request's larger ``max_tokens`` is lowered to it; no ``max_tokens``: this
    many); None: the sampling's ``max_new_tokens``."""
    max_seq_len: int | None = None
    """The engine's context (None: not checked by the door)."""
    max_threads: int = 64
    """Worker threads running plain (blocking) entrypoints at once."""
    max_request_chars: int | None = MAX_REQUEST_CHARS
    """The most characters of message text and tools in one call (400 past it, before tokenising)."""
    episode_mode: EpisodeMode = "linear"
    """linear: one conversation per session, one sample | tree: a sample per branch | individual: a sample per
    completion (``rollout.openai_tree``)."""
    reward_discount: float = 1.0
    """tree | individual: a completion without its own reward gets the episode's times this per later call."""


def task_dict(prompt: Prompt) -> dict[str, Any]:
    """What the agent is told about its task (plain JSON-able values)."""
    return {
        "prompt_id": prompt.prompt_id,
        "question": str(prompt.meta.get("question", "")),
        "answer": prompt.answer,
        "meta": dict(prompt.meta),
    }


class OpenAIAgentWorkflow:
    """G sessions of an ``openai``-client agent per prompt (see the module docstring)."""

    def __init__(
        self,
        tokenizer: Any,
        entrypoint: AgentEntrypoint,
        settings: DoorSettings | None = None,
        end_of_turn_ids: tuple[int, ...] = (),
        model_name: str = "asyncrl-policy",
    ) -> None:
        self.tokenizer = tokenizer
        self.entrypoint = entrypoint
        self.settings = settings or DoorSettings()
        self.end_of_turn_ids = end_of_turn_ids
        self.model_name = model_name
        self.api_key = new_api_key()
        self._threads: ThreadPoolExecutor | None = None

    def _door(self, engine: RolloutEngine) -> DoorServer:
        door = ChatDoor(
            engine,
            self.tokenizer,
            model_name=self.model_name,
            tool_format=self.settings.tool_format,
            end_of_turn_ids=self.end_of_turn_ids,
            max_seq_len=self.settings.max_seq_len,
            open_sessions_on_call=False,
            serves_any_model=True,
            max_request_chars=self.settings.max_request_chars,
        )
        return DoorServer(door, self.api_key)

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
        """``group_size`` sessions of the agent on ``prompt``; ``on_sample_done(i)`` as session ``i`` ends."""
        server = self._door(engine)
        await server.start()
        try:
            per_call = replace(sampling, max_new_tokens=self.settings.max_turn_tokens or sampling.max_new_tokens)
            episodes = await asyncio.gather(
                *(
                    self._episode(server, prompt, episode_sampling, score, i, on_sample_done)
                    for i, episode_sampling in enumerate(episode_samplings(per_call, group_size))
                )
            )
        finally:
            await server.stop()
        if self.settings.episode_mode == "linear":
            return group_of_episodes(prompt, [e for samples in episodes for e in samples], start_version)
        flat = [(i, e) for i, samples in enumerate(episodes) for e in samples]
        return replace(
            group_of_episodes(prompt, [e for _, e in flat], start_version), episodes=tuple(i for i, _ in flat)
        )

    async def _episode(
        self,
        server: DoorServer,
        prompt: Prompt,
        sampling: SamplingParams,
        score: ScoreFn,
        i: int,
        on_sample_done: SampleDone | None,
    ) -> list[ScoredEpisode]:
        """Episode ``i``'s samples (one in linear mode), each with its reward."""
        session_id = f"s{i}-{uuid.uuid4().hex[:12]}"
        branching = self.settings.episode_mode != "linear"
        session = server.door.open_session(session_id, sampling, self.settings.max_tokens, branching=branching)
        try:
            returned = await self._run_agent(server.base_url(session_id), task_dict(prompt))
        except Exception as e:
            if not session.calls:
                raise RuntimeError(f"the agent made no call before it raised: {type(e).__name__}: {e}") from e
            log.warning("openai_agent: the agent raised after %d calls (scored on them): %s", session.calls, e)
            returned = None
        if returned is not None and (isinstance(returned, bool) or not isinstance(returned, (int, float))):
            raise TypeError(f"the agent returned {returned!r}; return a reward (a number) or None")
        if not session.ended:
            server.door.store.end(session_id, None)
        if on_sample_done is not None:
            on_sample_done(i)
        traj = session.trajectory()
        server.door.store.discard(session_id)
        reward, failure = await self._episode_reward(returned, session, prompt, traj, score)
        if not branching:
            return [ScoredEpisode(traj, reward, failure)]
        mode = "tree" if self.settings.episode_mode == "tree" else "individual"
        samples = episode_samples(session.completions, mode, reward, self.settings.reward_discount)
        return [ScoredEpisode(s.trajectory, s.reward, failure) for s in samples]

    @staticmethod
    async def _episode_reward(
        returned: Any, session: ChatSession, prompt: Prompt, traj: Trajectory, score: ScoreFn
    ) -> tuple[float, str | None]:
        """What the entrypoint returned, else the reward sent to ``/end``, else the verifier's on ``traj``."""
        if returned is not None:
            return float(returned), None
        if session.reward is not None:
            return session.reward, None
        reward, failure = await score(prompt, traj.to_completion())
        return float(reward), failure

    async def _run_agent(self, base_url: str, task: dict[str, Any]) -> Any:
        """The entrypoint's return value (checked by the caller)."""
        if inspect.iscoroutinefunction(self.entrypoint):
            result = await self.entrypoint(base_url, self.api_key, task)
        else:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(self.settings.max_threads, thread_name_prefix="asyncrl-agent")
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(self._threads, self.entrypoint, base_url, self.api_key, task)
            if inspect.isawaitable(result):
                result = await result
        return result
