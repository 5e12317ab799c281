"""Sessions of the OpenAI-compatible door: every call recorded token for token, ended as a ``Trajectory``.

Owns the record of a session and its exactness rule. A session is one conversation between an agent
and the policy, named by an id in the base URL (``/sessions/<id>/v1``):

- the first call's messages are rendered through the chat template with their tools
  (``ChatRenderer.opening_ids``): the trajectory's opening (no loss);
- every call must *extend* the conversation recorded so far: the previous call's messages, the
  assistant message the door returned (as the client sends it back, ``openai_chat.normalized``), then
  new messages (tool results, a user turn; no assistant message the model did not write). The ids the
  engine is given are then the recorded ids (opening, model tokens exactly as sampled, earlier glue)
  plus the environment glue of the new messages rendered by ``ChatRenderer.env_ids``, the template's
  own text between two model turns. Nothing already recorded is rendered or tokenised again, so the
  trained ids are the engine's ids by construction. A call that does not extend the conversation, uses
  other tools, or arrives while another call of the session runs is refused (400), never guessed at;
- each reply is a ``ModelSegment`` (ids, behaviour log-probs, per-token versions, interruptions) and a
  ``TurnRecord`` (tool calls, malformed calls, and as tool latency the agent's time until its next call);
- ``end(reward)`` closes it: ``trajectory()`` is the ``types.Trajectory`` a workflow hands the
  controller, trained like any group member.

``SessionStore`` holds the open sessions and the recently ended ones of one door.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

from asyncrl.rollout.agent import turn_record
from asyncrl.rollout.chat import ChatRenderer
from asyncrl.rollout.envs.base import Message
from asyncrl.rollout.openai_chat import ChatRequest, Reply, normalized, same_message, template_messages, tool_tags
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.tools import ParsedTurn, ToolFormat
from asyncrl.types import EnvKind, EnvSegment, EpisodeEnd, ModelSegment, Segment, Trajectory, TurnRecord
from asyncrl.web import HTTPError

__all__ = ["ChatSession", "SessionStore", "TurnPlan"]


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


@dataclass
class ChatSession:
    """One conversation's record (see the module docstring)."""

    session_id: str
    renderer: ChatRenderer
    tool_format: ToolFormat
    sampling: SamplingParams | None = None
    """The session's sampling (a training workflow's); None: each request's own."""
    max_tokens: int | None = None
    """Tokens after the opening (model and glue); None: only the engine's context bounds it."""
    tools: tuple[dict[str, Any], ...] = ()
    prompt_ids: tuple[int, ...] = ()
    ids: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    conversation: list[dict[str, Any]] = field(default_factory=list)
    """Normalized messages so far, the last reply included: what the next call must start with."""
    history: list[Message] = field(default_factory=list)
    """Template messages before the latest assistant turn (``ChatRenderer.env_text``'s ``history``)."""
    last_text: str = ""
    last_closed_by: int | None = None
    last_reply_at: float = 0.0
    last_reply_wall: float = 0.0
    """``time.time()`` of the last reply: where the agent's tool time (until its next call) began."""
    busy: bool = False
    ended: bool = False
    reward: float | None = None

    @property
    def used(self) -> int:
        return len(self.ids) - len(self.prompt_ids)

    def plan(self, req: ChatRequest) -> TurnPlan:
        """The ids this call generates from; 400 when it does not extend the recorded conversation (the door
        calls it on open sessions only: ``SessionStore.end`` takes an ended one out of ``open``)."""
        if req.n != 1:
            raise HTTPError(400, "a session records one conversation: n must be 1")
        arrived_at = time.monotonic()
        messages = template_messages(req.messages, self.tool_format, tool_tags(req.tools))
        if not self.segments:
            opening = self.renderer.opening_ids(messages, req.tools)
            return TurnPlan(opening, (), messages, self._budget(0), arrived_at)
        prev = self.conversation
        if len(req.messages) < len(prev) or not all(
            same_message(a, b) for a, b in zip(req.messages, prev, strict=False)
        ):
            raise HTTPError(400, self._divergence(req.messages))
        if req.tools != self.tools:
            raise HTTPError(400, f"session {self.session_id}: the tools changed between calls of one session")
        new = req.messages[len(prev) :]
        if any(m["role"] == "assistant" for m in new):
            raise HTTPError(400, f"session {self.session_id}: new messages may not hold an assistant turn the "
                                 "model did not write (start another session for another conversation)")  # fmt: skip
        new_messages = messages[len(prev) :]
        env = self.renderer.env_ids(self.history, new_messages, self.tools, self.last_closed_by)
        budget = self._budget(len(env))
        return TurnPlan((*self.ids, *env), env, new_messages, budget, arrived_at)

    def _budget(self, glue: int) -> int:
        if self.max_tokens is None:
            return 1 << 30
        left = self.max_tokens - self.used - glue
        if left < 1:
            raise HTTPError(400, f"session {self.session_id}: its token budget of {self.max_tokens} is spent")
        return left

    def _divergence(self, messages: tuple[dict[str, Any], ...]) -> str:
        at = next(
            (i for i, (a, b) in enumerate(zip(messages, self.conversation, strict=False)) if not same_message(a, b)),
            min(len(messages), len(self.conversation)),
        )
        return (
            f"session {self.session_id}: message {at} differs from the recorded conversation (the previous "
            "call's messages, then the assistant message as returned); a session holds one conversation, "
            "extended call by call: start another session (another base URL) for another one"
        )

    def record(
        self,
        req: ChatRequest,
        plan: TurnPlan,
        segment: ModelSegment,
        reply: Reply,
        text: str,
        parsed: ParsedTurn,
        closed_by: int | None,
    ) -> None:
        """Append a call's glue and reply (after the engine answered ``plan``)."""
        now = time.monotonic()
        if not self.segments:
            self.prompt_ids = plan.input_ids
            self.ids = list(plan.input_ids)
            self.tools = req.tools
            self.history = list(plan.new_history)
        else:
            self.segments.append(EnvSegment(plan.env_ids, _env_kind(req.messages[len(self.conversation) :])))
            self.ids.extend(plan.env_ids)
            last = self.turns[-1]
            waited = plan.arrived_at - self.last_reply_at  # the agent's time: reply out -> this call in
            self.turns[-1] = replace(last, env_tokens=len(plan.env_ids), tool_latency_s=waited,
                                     tool_started_at=self.last_reply_wall)  # fmt: skip
            self.history += [Message("assistant", self.last_text), *plan.new_history]
        self.segments.append(segment)
        self.ids.extend(segment.token_ids)
        self.turns.append(turn_record(segment, parsed))
        self.conversation = [*req.messages, normalized(reply.message)]
        self.last_text = text
        self.last_closed_by = closed_by
        self.last_reply_at, self.last_reply_wall = now, time.time()

    def end(self, reward: float | None) -> None:
        self.ended = True
        self.reward = reward

    def trajectory(self) -> Trajectory:
        """The session as a trajectory (needs one recorded call)."""
        if not self.segments:
            raise ValueError(f"session {self.session_id} recorded no call: it has no trajectory")
        return Trajectory(
            prompt_ids=self.prompt_ids,
            segments=tuple(self.segments),
            turns=tuple(self.turns),
            end=self._end_reason(),
            env_reward=self.reward,
        )

    def _end_reason(self) -> EpisodeEnd:
        last = self.turns[-1]
        if last.finish_reason == "length":
            return "length"
        return "env_done" if last.tool_calls or last.malformed else "answer"

    def summary(self) -> dict[str, Any]:
        """The record as JSON (``GET /sessions/<id>``): ids, loss mask, log-probs, versions, turns."""
        out: dict[str, Any] = {"session_id": self.session_id, "ended": self.ended, "reward": self.reward,
                               "calls": len(self.turns)}  # fmt: skip
        if self.segments:
            t = self.trajectory()
            out |= {
                "prompt_ids": list(t.prompt_ids), "response_ids": list(t.response_ids),
                "loss_mask": list(t.loss_mask), "behav_logprobs": list(t.behav_logprobs),
                "versions": list(t.versions), "end": t.end,
                "turns": [{"model_tokens": r.model_tokens, "env_tokens": r.env_tokens, "min_version": r.min_version,
                           "max_version": r.max_version, "tool_calls": list(r.tool_calls), "malformed": r.malformed,
                           "finish_reason": r.finish_reason} for r in t.turns],
            }  # fmt: skip
        return out


def _env_kind(messages: tuple[dict[str, Any], ...]) -> EnvKind:
    """``tool`` when the new messages hold a tool result, else ``user``."""
    return "tool" if any(m["role"] == "tool" for m in messages) else "user"


class SessionStore:
    """The open sessions of one door, and the last ``keep_ended`` ended ones (for ``GET``)."""

    def __init__(self, keep_ended: int = 1024) -> None:
        self.open: dict[str, ChatSession] = {}
        self.ended: OrderedDict[str, ChatSession] = OrderedDict()
        self.keep_ended = keep_ended

    def add(self, session: ChatSession) -> ChatSession:
        if session.session_id in self.open or session.session_id in self.ended:
            raise ValueError(f"session {session.session_id} exists")
        self.open[session.session_id] = session
        return session

    def get(self, session_id: str) -> ChatSession | None:
        return self.open.get(session_id) or self.ended.get(session_id)

    def end(self, session_id: str, reward: float | None) -> ChatSession:
        session = self.open.pop(session_id, None)
        if session is None:
            if session_id in self.ended:
                raise HTTPError(400, f"session {session_id} has already ended")
            raise HTTPError(404, f"no session {session_id}")
        session.end(reward)
        self.ended[session_id] = session
        while len(self.ended) > self.keep_ended:
            self.ended.popitem(last=False)
        return session

    def discard(self, session_id: str) -> None:
        self.open.pop(session_id, None)
        self.ended.pop(session_id, None)
