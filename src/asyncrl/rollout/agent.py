"""The multi-turn workflow: episodes of model turns and environment steps, exact token for token.

Owns the episode loop. ``run_agent_episode`` plays one episode against an engine handle
(``rollout.api.RolloutEngine``) and an ``Environment`` (``rollout.envs``):

1. ``env.reset(prompt)``: the opening is the environment's messages rendered through the chat
   template (with its tools), or the prompt's own ids;
2. a model turn: the engine generates from the sequence so far until an end-of-turn token (or a
   single-token tool-call close tag, with ``stop_at_tool_close``) or the turn's budget; weight
   updates in ``abort`` mode are resumed by ``interruptible.generate_group``; the ids, behaviour
   log-probs and per-token versions go into a ``ModelSegment`` exactly as returned;
3. the turn's text is parsed for tool calls (``rollout.tools``) and handed to ``env.step``, which
   the event loop awaits while the engine decodes other episodes; malformed calls are answered with
   an error message the model sees, counted, and optionally penalised;
4. the environment's messages become an ``EnvSegment`` through ``chat.ChatRenderer`` (the template's
   glue included), and the next turn generates from the longer sequence;

until the environment is done (the answer turn of a tool environment), or the turn budget
(``max_turns``), the token budget (``max_tokens``: every token after the opening, model and
environment) or a turn's budget runs out. The result is a ``Trajectory`` whose ``token_ids`` are,
by construction, the ids the engine was given and produced: nothing is re-tokenised.

``AgentWorkflow`` runs a group of such episodes (concurrently, one fresh environment each) behind
the same call as the single-turn ``workflow.run_episode`` and returns a ``Group`` whose completions
are the flattened trajectories (``loss_mask`` 0 on environment tokens) and whose rewards come from
the environment when it scores episodes, else from the ``score`` callable the controller hands in.
With ``AgentSettings.tool_latency`` each episode's environment is wrapped in ``envs.latency.DelayedTools``
(a seeded simulated wait before each turn with tool calls is answered, the episode's own stream).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from asyncrl.rollout.api import RolloutEngine, SampleDone
from asyncrl.rollout.chat import ChatRenderer
from asyncrl.rollout.envs.base import Environment, EnvReset, Message, ModelTurn, StepResult
from asyncrl.rollout.envs.latency import DelayedTools, ToolLatency
from asyncrl.rollout.interruptible import generate_group
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.tools import ParsedTurn, ToolFormat, close_tags, parse_tool_calls
from asyncrl.rollout.workflow import ScoredEpisode, ScoreFn, episode_samplings, group_of_episodes
from asyncrl.types import (
    EnvSegment,
    EpisodeEnd,
    Group,
    ModelSegment,
    Prompt,
    Segment,
    Trajectory,
    TurnRecord,
)

__all__ = ["AgentSettings", "AgentWorkflow", "EnvFactory", "run_agent_episode", "turn_record"]

EnvFactory = Callable[[], Environment]
"""Makes a fresh environment for one episode."""


@dataclass(frozen=True)
class AgentSettings:
    """Budgets and the call format of multi-turn episodes."""

    tool_format: ToolFormat = "hermes"
    max_turns: int = 4
    """Model turns per episode."""
    max_tokens: int = 512
    """Tokens after the opening (model and environment); keep opening + this within the engine's
    context (``max_seq_len``)."""
    max_turn_tokens: int | None = None
    """Tokens per model turn; None: the sampling params' ``max_new_tokens``."""
    stop_at_tool_close: bool = False
    """Also end a turn at the call format's close tag (must be one token, like Qwen's ``</tool_call>``);
    the template's glue then closes the turn. Off: one turn may hold several calls."""
    malformed_penalty: float = 0.0
    """Subtracted from the episode's reward per malformed call."""
    tool_latency: ToolLatency = field(default_factory=ToolLatency)
    """A simulated wait before the environment answers a turn with tool calls (``envs.latency``); none
    by default."""

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.max_tokens < 1:
            raise ValueError("AgentSettings: max_turns and max_tokens must be >= 1")
        if self.max_turn_tokens is not None and self.max_turn_tokens < 1:
            raise ValueError("AgentSettings: max_turn_tokens must be >= 1 (or None)")


@dataclass
class _Episode:
    """The growing state of one episode."""

    prompt_ids: tuple[int, ...]
    reset: EnvReset
    history: list[Message]
    ids: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    malformed: int = 0

    @property
    def used(self) -> int:
        """Tokens after the opening."""
        return len(self.ids) - len(self.prompt_ids)

    def trajectory(self, end: EpisodeEnd) -> Trajectory:
        return Trajectory(
            prompt_ids=self.prompt_ids,
            segments=tuple(self.segments),
            turns=tuple(self.turns),
            end=end,
            env_reward=sum(self.rewards) if self.reset.scores else None,
        )


def _stop_ids(
    renderer: ChatRenderer, sampling: SamplingParams, settings: AgentSettings, tags: tuple[str, ...]
) -> tuple[tuple[int, ...], frozenset[int]]:
    """(every token that ends a turn, the close-tag tokens among them). A turn ended by any other
    stop token was closed by the model (``ChatRenderer.env_text``'s ``closed_by``)."""
    close: set[int] = set()
    if settings.stop_at_tool_close:
        for tag in close_tags(settings.tool_format, tags):
            ids = renderer.encode(tag)
            if len(ids) != 1:
                raise ValueError(f"stop_at_tool_close: {tag!r} is {len(ids)} tokens in this tokenizer, not one")
            close.add(ids[0])
    stops = set(sampling.stop_token_ids) | set(renderer.end_of_turn_ids) | close
    return tuple(sorted(stops)), frozenset(close - set(renderer.end_of_turn_ids))


def turn_record(
    seg: ModelSegment,
    parsed: ParsedTurn,
    env_tokens: int = 0,
    step: StepResult | None = None,
    latency: float = 0.0,
    started_at: float | None = None,
) -> TurnRecord:
    """One model turn's record: its segment, the calls parsed from it, the glue that followed (``env_tokens``),
    the environment's answer (``step``; None: not stepped), its latency and the wall-clock time the
    environment's step began (``started_at``; None: not stepped) (also the OpenAI door's sessions')."""
    return TurnRecord(
        model_tokens=len(seg.token_ids),
        env_tokens=env_tokens,
        min_version=min(seg.versions, default=-1),
        max_version=max(seg.versions, default=-1),
        finish_reason=seg.finish_reason,
        num_interruptions=seg.num_interruptions,
        tool_calls=tuple(c.name for c in parsed.calls),
        tool_errors=step.tool_errors if step is not None else 0,
        tool_hits=step.tool_hits if step is not None else None,
        malformed=len(parsed.errors),
        tool_latency_s=latency,
        tool_started_at=started_at,
    )


async def _open(env: Environment, renderer: ChatRenderer, prompt: Prompt) -> _Episode:
    reset = await env.reset(prompt)
    if reset.messages:
        history = list(reset.messages)
        prompt_ids = renderer.opening_ids(history, reset.tools)
    else:
        history = [Message("user", str(prompt.meta.get("question", "")))]
        prompt_ids = tuple(int(t) for t in prompt.token_ids)
    return _Episode(prompt_ids=prompt_ids, reset=reset, history=history, ids=list(prompt_ids))


async def _model_turn(
    engine: RolloutEngine, ep: _Episode, sampling: SamplingParams, budget: int, stops: tuple[int, ...]
) -> ModelSegment:
    params = replace(sampling, max_new_tokens=budget, stop_token_ids=stops)
    (c,) = await generate_group(engine, ep.ids, params, 1)
    seg = ModelSegment(c.output_ids, c.behav_logprobs, c.versions, c.finish_reason, c.num_interruptions)
    ep.segments.append(seg)
    ep.ids.extend(seg.token_ids)
    return seg


async def run_agent_episode(
    engine: RolloutEngine,
    env: Environment,
    renderer: ChatRenderer,
    prompt: Prompt,
    sampling: SamplingParams,
    settings: AgentSettings,
) -> Trajectory:
    """One episode (see the module docstring). ``sampling``: the per-turn sampling (its seed, when
    set, is the episode's: positions differ from turn to turn, so draws do too); the caller closes
    ``env``."""
    ep = await _open(env, renderer, prompt)
    stops, close_ids = _stop_ids(renderer, sampling, settings, tuple(ep.reset.tags))
    turn_cap = settings.max_turn_tokens or sampling.max_new_tokens
    end: EpisodeEnd = "max_turns"
    for index in range(settings.max_turns):
        budget = min(turn_cap, settings.max_tokens - ep.used)
        if budget <= 0:
            end = "max_tokens"
            break
        seg = await _model_turn(engine, ep, sampling, budget, stops)
        last = seg.token_ids[-1]
        closed_by = last if seg.finish_reason == "stop" and last not in close_ids else None
        own = seg.token_ids[:-1] if closed_by is not None else seg.token_ids
        text = renderer.tokenizer.decode(list(own), skip_special_tokens=False)
        parsed = parse_tool_calls(settings.tool_format, text, ep.reset.tags)
        ep.malformed += len(parsed.errors)
        if seg.finish_reason == "length":
            ep.turns.append(turn_record(seg, parsed))
            end = "length" if budget == turn_cap else "max_tokens"
            break
        started, started_at = time.monotonic(), time.time()
        step = await env.step(ModelTurn(index, text, parsed))
        latency = time.monotonic() - started
        if step.reward is not None:
            ep.rewards.append(float(step.reward))
        if step.done or index == settings.max_turns - 1:
            ep.turns.append(turn_record(seg, parsed, 0, step, latency, started_at))
            end = ("answer" if parsed.is_answer else "env_done") if step.done else "max_turns"
            break
        env_ids = renderer.env_ids(ep.history, step.messages, ep.reset.tools, closed_by)
        if ep.used + len(env_ids) >= settings.max_tokens:  # no room left for a model token after it
            ep.turns.append(turn_record(seg, parsed, 0, step, latency, started_at))
            end = "max_tokens"
            break
        ep.segments.append(EnvSegment(env_ids, step.kind))
        ep.ids.extend(env_ids)
        ep.history += [Message("assistant", text), *step.messages]
        ep.turns.append(turn_record(seg, parsed, len(env_ids), step, latency, started_at))
    return ep.trajectory(end)


class AgentWorkflow:
    """A group of multi-turn episodes behind ``workflow.run_episode``'s call (see the module docstring)."""

    def __init__(
        self,
        tokenizer: Any,
        make_env: EnvFactory,
        settings: AgentSettings | None = None,
        end_of_turn_ids: tuple[int, ...] = (),
    ) -> None:
        """``end_of_turn_ids``: the tokens that end a model turn (default: the tokenizer's EOS; the
        sampling params' stop tokens count too)."""
        self.renderer = ChatRenderer(tokenizer, end_of_turn_ids)
        self.make_env = make_env
        self.settings = settings or AgentSettings()

    async def _episode(
        self,
        engine: RolloutEngine,
        prompt: Prompt,
        sampling: SamplingParams,
        score: ScoreFn,
        i: int,
        on_sample_done: SampleDone | None,
    ) -> ScoredEpisode:
        env = self.make_env()
        latency = self.settings.tool_latency
        if latency.active:
            env = DelayedTools(env, latency, latency.stream(prompt.prompt_id, i))
        try:
            traj = await run_agent_episode(engine, env, self.renderer, prompt, sampling, self.settings)
        finally:
            await env.close()
        if on_sample_done is not None:
            on_sample_done(i)
        failure = None
        if traj.env_reward is not None:
            reward = traj.env_reward
        else:
            reward, failure = await score(prompt, traj.to_completion())
        malformed = sum(t.malformed for t in traj.turns)
        return ScoredEpisode(traj, float(reward) - self.settings.malformed_penalty * malformed, failure)

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
        """``group_size`` episodes of ``prompt``; ``on_sample_done(i)`` as episode ``i`` ends."""
        episodes = await asyncio.gather(
            *(
                self._episode(engine, prompt, episode_sampling, score, i, on_sample_done)
                for i, episode_sampling in enumerate(episode_samplings(sampling, group_size))
            )
        )
        return group_of_episodes(prompt, episodes, start_version)
