"""Episodes that branch or trim: the door's completions recorded one by one, and what they train as.

Owns the record of a session in ``agent.episode_mode`` ``tree`` or ``individual`` (``ChatSession`` with
``branching``) and the samples a workflow makes of it. Such a session holds any number of conversations: an
agent may trim, summarise or edit its history, branch from an earlier point, or make concurrent calls, all
under one base URL. Each call is one ``CompletionRecord``:

- its *parent* is the recorded completion whose conversation (its messages, then its reply as the client
  sends it back, ``openai_chat.normalized``) the call's messages extend furthest, with the same tools (or
  none) and no assistant message after it that the model did not write. The call's ids are then the
  parent's ids (its prompt and its sampled tokens exactly as sampled) plus the glue of the new messages
  (``ChatRenderer.env_ids``): nothing recorded is rendered again, as in a linear session;
- a call that extends no completion (the first, a trimmed or edited history, a summary) is a *root*: its
  messages rendered through the chat template (``ChatRenderer.opening_ids``), the template's own ids;
- a completion may have several children (branches: concurrent sub-calls from one prefix).

What each completion trains as (``episode_samples``):

- ``individual``: one sample per completion, its prompt ids (everything before its tokens: the opening,
  earlier model tokens and glue, all out of the loss) and its own tokens in the loss;
- ``tree``: one sample per leaf, the chain from its root joined into one sequence (root opening, then each
  completion's tokens in the loss and the glue between them out of it), as a linear session's trajectory.
  A completion shared by several branches is trained in each of them.

Rewards: a completion may be given its own (``set_reward``: the door's ``/reward`` route); one without
gets the episode's reward times ``discount ** k``, ``k`` the longest run of sequential calls after it (a
call is after another when it arrived after that one's reply). A ``tree`` sample's reward is its leaf's.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from asyncrl.rollout.agent import turn_record
from asyncrl.rollout.chat import ChatRenderer
from asyncrl.rollout.envs.base import Message
from asyncrl.rollout.openai_chat import Reply, normalized, same_message, template_messages, tool_tags
from asyncrl.rollout.openai_request import ChatRequest
from asyncrl.rollout.tools import ParsedTurn, ToolFormat
from asyncrl.types import EnvKind, EnvSegment, EpisodeEnd, ModelSegment, Segment, Trajectory, TurnRecord
from asyncrl.web import HTTPError

__all__ = ["CompletionRecord", "EpisodeSample", "TurnPlan", "completion_rewards", "episode_samples", "find_parent"]

SampleMode = Literal["tree", "individual"]


@dataclass(frozen=True)
class TurnPlan:
    """What one call will generate from, before anything is recorded."""

    input_ids: tuple[int, ...]
    """The recorded ids plus ``env_ids`` (or, on the first call, the opening)."""
    env_ids: tuple[int, ...]
    """The glue of the call's new messages (empty on the first call)."""
    new_history: tuple[Message, ...]
    """The template messages the call adds (after the latest assistant turn)."""
    budget: int
    """Tokens left to the session after the glue (``max_tokens`` minus what is recorded)."""
    arrived_at: float = 0.0
    """``time.monotonic()`` when the call arrived (planned): the end of the agent's time since the last reply."""
    parent: int | None = None
    """A branching session's: the completion the call extends (None: a root)."""


@dataclass
class CompletionRecord:
    """One call of a branching session, as the engine saw and answered it."""

    completion_id: str
    """The ``id`` of the ``chat.completion`` the door answered (how an agent names it for ``/reward``)."""
    parent: int | None
    """The index of the completion this call extended (None: a root)."""
    input_ids: tuple[int, ...]
    """The ids the engine generated from: the parent's ids and ``env_ids``, or a root's rendered opening."""
    env_ids: tuple[int, ...]
    """The glue after the parent's tokens (empty for a root)."""
    env_kind: EnvKind
    segment: ModelSegment
    turn: TurnRecord
    conversation: tuple[dict[str, Any], ...]
    """The call's messages and its reply (normalized): what a later call extends."""
    history: tuple[Message, ...]
    """Template messages before this reply (``ChatRenderer.env_ids``' ``history`` for a child)."""
    text: str
    closed_by: int | None
    tools: tuple[dict[str, Any], ...]
    arrived_at: float
    replied_at: float
    replied_wall: float
    reward: float | None = None

    @property
    def ids(self) -> tuple[int, ...]:
        return (*self.input_ids, *self.segment.token_ids)


@dataclass(frozen=True)
class EpisodeSample:
    """One training sample of an episode, with its reward and the completions it holds (by index)."""

    trajectory: Trajectory
    reward: float
    completions: tuple[int, ...]


def find_parent(records: Sequence[CompletionRecord], req: ChatRequest) -> int | None:
    """The completion ``req``'s messages extend furthest (the latest among equals), or None."""
    best: int | None = None
    for i, rec in enumerate(records):
        n = len(rec.conversation)
        if len(req.messages) < n or (req.tools and req.tools != rec.tools):
            continue
        if any(m["role"] == "assistant" for m in req.messages[n:]):
            continue
        if not all(same_message(a, b) for a, b in zip(req.messages, rec.conversation, strict=False)):
            continue
        if best is None or n >= len(records[best].conversation):
            best = i
    return best


def call_tools(records: Sequence[CompletionRecord], req: ChatRequest) -> tuple[dict[str, Any], ...]:
    """The tools a call of a branching session runs with: its parent's, or a root's own."""
    parent = find_parent(records, req)
    return req.tools if parent is None else records[parent].tools


def spent(records: Sequence[CompletionRecord]) -> int:
    """Tokens a branching session has recorded after its roots' openings (glue and model tokens)."""
    return sum(len(r.env_ids) + len(r.segment.token_ids) for r in records)


def plan_call(
    records: Sequence[CompletionRecord],
    renderer: ChatRenderer,
    fmt: ToolFormat,
    req: ChatRequest,
    lead_ids: tuple[int, ...],
    budget_left: Callable[[int], int],
) -> TurnPlan:
    """The ids a call of a branching session generates from (module docstring); ``budget_left(glue)``: the
    session's tokens left after ``glue`` more."""
    arrived_at = time.monotonic()
    parent = find_parent(records, req)
    if parent is None:
        messages = template_messages(req.messages, fmt, tool_tags(req.tools))
        opening = (*renderer.opening_ids(messages, req.tools), *lead_ids)
        return TurnPlan(opening, (), messages, budget_left(len(lead_ids)), arrived_at, parent=None)
    rec = records[parent]
    new = template_messages(req.messages[len(rec.conversation) :], fmt, tool_tags(rec.tools))
    env = (*renderer.env_ids(rec.history, new, rec.tools, rec.closed_by), *lead_ids)
    return TurnPlan((*rec.ids, *env), env, new, budget_left(len(env)), arrived_at, parent=parent)


def record_call(
    records: list[CompletionRecord],
    req: ChatRequest,
    plan: TurnPlan,
    segment: ModelSegment,
    reply: Reply,
    text: str,
    parsed: ParsedTurn,
    closed_by: int | None,
) -> str:
    """Append a call of a branching session (after the engine answered ``plan``); its completion id."""
    kind: EnvKind = "user"
    if plan.parent is None:
        tools, history = req.tools, tuple(plan.new_history)
    else:
        rec = records[plan.parent]
        tools, history = rec.tools, (*rec.history, Message("assistant", rec.text), *plan.new_history)
        if any(m["role"] == "tool" for m in req.messages[len(rec.conversation) :]):
            kind = "tool"
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    records.append(
        CompletionRecord(
            completion_id,
            plan.parent,
            plan.input_ids,
            plan.env_ids,
            kind,
            segment,
            turn_record(segment, parsed),
            (*req.messages, normalized(reply.message)),
            history,
            text,
            closed_by,
            tools,
            plan.arrived_at,
            time.monotonic(),
            time.time(),
        )
    )
    return completion_id


def set_reward(records: Sequence[CompletionRecord], completion_id: str, reward: float) -> None:
    """Give completion ``completion_id`` its own reward (404 when the session has no such completion)."""
    for rec in records:
        if rec.completion_id == completion_id:
            rec.reward = reward
            return
    raise HTTPError(404, f"no completion {completion_id[:80]!r} in this session")


def completion_rewards(records: Sequence[CompletionRecord], episode_reward: float, discount: float) -> list[float]:
    """Each completion's reward: its own, else ``episode_reward * discount ** k`` (module docstring)."""
    order = sorted(range(len(records)), key=lambda i: records[i].arrived_at, reverse=True)
    after = [0] * len(records)  # the longest run of sequential calls after each completion
    for i in order:
        later = [after[j] + 1 for j in order if records[j].arrived_at >= records[i].replied_at and j != i]
        after[i] = max(later, default=0)
    return [r.reward if r.reward is not None else episode_reward * discount ** after[i] for i, r in enumerate(records)]


def _end(turn: TurnRecord) -> EpisodeEnd:
    if turn.finish_reason == "length":
        return "length"
    return "env_done" if turn.tool_calls or turn.malformed else "answer"


def chain(records: Sequence[CompletionRecord], leaf: int) -> list[int]:
    """The completions from a root to ``leaf``, in order."""
    out = [leaf]
    while (parent := records[out[-1]].parent) is not None:
        out.append(parent)
    return out[::-1]


def chain_trajectory(records: Sequence[CompletionRecord], indices: Sequence[int]) -> Trajectory:
    """The completions ``indices`` (a root, then each one's child) joined into one trajectory."""
    first = records[indices[0]]
    segments: list[Segment] = [first.segment]
    turns: list[TurnRecord] = []
    for prev, nxt in zip(indices, indices[1:], strict=False):
        p, n = records[prev], records[nxt]
        turns.append(
            replace(
                p.turn,
                env_tokens=len(n.env_ids),
                tool_latency_s=n.arrived_at - p.replied_at,
                tool_started_at=p.replied_wall,
            )
        )
        segments += [EnvSegment(n.env_ids, n.env_kind), n.segment]
    last = records[indices[-1]].turn
    turns.append(last)
    return Trajectory(prompt_ids=first.input_ids, segments=tuple(segments), turns=tuple(turns), end=_end(last))


def episode_samples(
    records: Sequence[CompletionRecord], mode: SampleMode, episode_reward: float, discount: float
) -> list[EpisodeSample]:
    """What the completions of one episode train as (module docstring), in recording order."""
    rewards = completion_rewards(records, episode_reward, discount)
    if mode == "individual":
        return [
            EpisodeSample(
                Trajectory(prompt_ids=r.input_ids, segments=(r.segment,), turns=(r.turn,), end=_end(r.turn)),
                rewards[i],
                (i,),
            )
            for i, r in enumerate(records)
        ]
    parents = {r.parent for r in records}
    leaves = [i for i in range(len(records)) if i not in parents]
    return [EpisodeSample(chain_trajectory(records, c := chain(records, i)), rewards[i], tuple(c)) for i in leaves]


def last_chain(records: Sequence[CompletionRecord]) -> Trajectory:
    """The chain ending at the latest completion (what a verifier scores when the agent gave no reward)."""
    return chain_trajectory(records, chain(records, len(records) - 1))


def summary(records: Sequence[CompletionRecord]) -> list[dict[str, Any]]:
    """Each completion as JSON (``GET /sessions/<id>`` of a branching session)."""
    return [
        {
            "id": r.completion_id,
            "parent": r.parent,
            "prompt_ids": list(r.input_ids),
            "output_ids": list(r.segment.token_ids),
            "behav_logprobs": list(r.segment.behav_logprobs),
            "versions": list(r.segment.versions),
            "finish_reason": r.segment.finish_reason,
            "reward": r.reward,
        }
        for r in records
    ]
