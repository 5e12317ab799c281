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
  other tools, or arrives while another call of the session runs is refused (400), never guessed at. A
  *branching* session (``agent.episode_mode`` tree or individual) takes such calls instead, each recorded
  as one completion with its own prefix (``rollout.openai_tree``);
- each reply is a ``ModelSegment`` (ids, behaviour log-probs, per-token versions, interruptions) and a
  ``TurnRecord`` (tool calls, malformed calls, and as tool latency the agent's time until its next call);
- ``end(reward)`` closes it: ``trajectory()`` is the ``types.Trajectory`` a workflow hands the
  controller, trained like any group member.

``SessionStore`` holds the open sessions and the recently ended ones of one door, within bounds a
server sets: an open session with no call for ``ttl_s`` expires, and past ``max_open`` open sessions
the least recently used idle one is evicted (a session with a call running is never dropped; when all
are, a new one is refused with 429). A dropped session's id is remembered (the last ``keep_gone``),
so its next call, end or record answers 404 saying why, instead of opening a new session under that id.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from asyncrl.rollout import openai_tree
from asyncrl.rollout.agent import turn_record
from asyncrl.rollout.chat import ChatRenderer
from asyncrl.rollout.envs.base import Message
from asyncrl.rollout.openai_chat import Reply, normalized, same_message, template_messages, tool_tags
from asyncrl.rollout.openai_request import ChatRequest
from asyncrl.rollout.openai_tree import TurnPlan
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.tools import ParsedTurn, ToolFormat
from asyncrl.types import EnvKind, EnvSegment, EpisodeEnd, ModelSegment, Segment, Trajectory, TurnRecord
from asyncrl.web import HTTPError

__all__ = ["ChatSession", "SessionStore", "TurnPlan"]


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
    running: int = 0
    """Calls of the session running now (at most one unless ``branching``)."""
    last_used: float = 0.0
    """The ``SessionStore`` clock's time of the session's latest use (opened, a call began or ended)."""
    ended: bool = False
    reward: float | None = None
    branching: bool = False
    """Any history, concurrent calls: each call one ``openai_tree.CompletionRecord`` in ``completions``."""
    completions: list[openai_tree.CompletionRecord] = field(default_factory=list)

    @property
    def busy(self) -> bool:
        """A call of the session is running."""
        return self.running > 0

    @busy.setter
    def busy(self, value: bool) -> None:
        self.running = int(value)

    @property
    def calls(self) -> int:
        return len(self.completions) if self.branching else len(self.turns)

    @property
    def used(self) -> int:
        if self.branching:
            return openai_tree.spent(self.completions)
        return len(self.ids) - len(self.prompt_ids)

    def call_tools(self, req: ChatRequest) -> tuple[dict[str, Any], ...]:
        """The tools the call ``req`` runs with (those of the conversation it extends, or its own)."""
        if self.branching:
            return openai_tree.call_tools(self.completions, req)
        return self.tools if self.segments else req.tools

    def plan(self, req: ChatRequest, lead_ids: tuple[int, ...] = ()) -> TurnPlan:
        """The ids this call generates from; 400 when it does not extend the recorded conversation (the door
        calls it on open sessions only: ``SessionStore.end`` takes an ended one out of ``open``). ``lead_ids``:
        what the door writes for the model after the glue (the opening of a call it must make), environment
        tokens like the glue."""
        if req.n != 1:
            raise HTTPError(400, "a session records one conversation: n must be 1")
        if self.branching:
            return openai_tree.plan_call(
                self.completions, self.renderer, self.tool_format, req, lead_ids, self.budget_left
            )
        arrived_at = time.monotonic()
        if not self.segments:
            messages = template_messages(req.messages, self.tool_format, tool_tags(req.tools))
            opening = (*self.renderer.opening_ids(messages, req.tools), *lead_ids)
            return TurnPlan(opening, (), messages, self.budget_left(len(lead_ids)), arrived_at)
        prev = self.conversation
        if len(req.messages) < len(prev) or not all(
            same_message(a, b) for a, b in zip(req.messages, prev, strict=False)
        ):
            raise HTTPError(400, self._divergence(req.messages))
        if req.tools and req.tools != self.tools:
            raise HTTPError(
                400,
                f"session {self.session_id}: the tools changed between calls. A session's tools are "
                "in its opening, recorded as the model saw them: a call may send them again or "
                "none (a final answer: its calls are not read), not others; start another "
                "session for other tools",
            )
        new = req.messages[len(prev) :]
        if any(m["role"] == "assistant" for m in new):
            raise HTTPError(
                400,
                f"session {self.session_id}: new messages may not hold an assistant turn the "
                "model did not write (start another session for another conversation)",
            )
        new_messages = template_messages(new, self.tool_format, tool_tags(self.tools))
        env = self.renderer.env_ids(self.history, new_messages, self.tools, self.last_closed_by)
        env = (*env, *lead_ids)
        budget = self.budget_left(len(env))
        return TurnPlan((*self.ids, *env), env, new_messages, budget, arrived_at)

    def budget_left(self, glue: int) -> int:
        """Tokens a call may sample after ``glue`` more (400 when none are left)."""
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
    ) -> str | None:
        """Append a call's glue and reply (after the engine answered ``plan``); a branching session's
        completion id (how ``/reward`` names it), else None."""
        if self.branching:
            return openai_tree.record_call(self.completions, req, plan, segment, reply, text, parsed, closed_by)
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
            self.turns[-1] = replace(
                last, env_tokens=len(plan.env_ids), tool_latency_s=waited, tool_started_at=self.last_reply_wall
            )
            self.history += [Message("assistant", self.last_text), *plan.new_history]
        self.segments.append(segment)
        self.ids.extend(segment.token_ids)
        self.turns.append(turn_record(segment, parsed))
        self.conversation = [*req.messages, normalized(reply.message)]
        self.last_text = text
        self.last_closed_by = closed_by
        self.last_reply_at, self.last_reply_wall = now, time.time()
        return None

    def end(self, reward: float | None) -> None:
        self.ended = True
        self.reward = reward

    def trajectory(self) -> Trajectory:
        """The session as a trajectory (needs one recorded call)."""
        if self.branching:
            if not self.completions:
                raise ValueError(f"session {self.session_id} recorded no call: it has no trajectory")
            return openai_tree.last_chain(self.completions)
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
        out: dict[str, Any] = {
            "session_id": self.session_id,
            "ended": self.ended,
            "reward": self.reward,
            "calls": self.calls,
        }
        if self.branching:
            return out | {"completions": openai_tree.summary(self.completions)}
        if self.segments:
            t = self.trajectory()
            out |= {
                "prompt_ids": list(t.prompt_ids),
                "response_ids": list(t.response_ids),
                "loss_mask": list(t.loss_mask),
                "behav_logprobs": list(t.behav_logprobs),
                "versions": list(t.versions),
                "end": t.end,
                "turns": [
                    {
                        "model_tokens": r.model_tokens,
                        "env_tokens": r.env_tokens,
                        "min_version": r.min_version,
                        "max_version": r.max_version,
                        "tool_calls": list(r.tool_calls),
                        "malformed": r.malformed,
                        "finish_reason": r.finish_reason,
                    }
                    for r in t.turns
                ],
            }
        return out


def _env_kind(messages: tuple[dict[str, Any], ...]) -> EnvKind:
    """``tool`` when the new messages hold a tool result, else ``user``."""
    return "tool" if any(m["role"] == "tool" for m in messages) else "user"


class SessionStore:
    """The open sessions of one door, and the last ``keep_ended`` ended ones (for ``GET``); see the module
    docstring for ``max_open`` and ``ttl_s`` (None: unbounded) and ``keep_gone``. ``clock``: seconds,
    monotonic."""

    def __init__(
        self,
        keep_ended: int = 1024,
        *,
        max_open: int | None = None,
        ttl_s: float | None = None,
        keep_gone: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_open is not None and max_open < 1:
            raise ValueError(f"max_open must be >= 1 (or None), got {max_open}")
        if ttl_s is not None and not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0 (or None), got {ttl_s}")
        self.open: OrderedDict[str, ChatSession] = OrderedDict()
        """Least recently used first."""
        self.ended: OrderedDict[str, ChatSession] = OrderedDict()
        self.gone: OrderedDict[str, str] = OrderedDict()
        """Expired or evicted session ids -> why (the last ``keep_gone``)."""
        self.keep_ended = keep_ended
        self.max_open = max_open
        self.ttl_s = ttl_s
        self.keep_gone = keep_gone
        self.clock = clock
        self.expired = 0
        self.evicted = 0

    def add(self, session: ChatSession) -> ChatSession:
        """Open ``session`` (``ValueError`` for an id in use or dropped; 429 when full of running sessions)."""
        self.expire()
        sid = session.session_id
        if sid in self.open or sid in self.ended or sid in self.gone:
            raise ValueError(f"session {sid} exists")
        if self.max_open is not None and len(self.open) >= self.max_open:
            idle = next((s for s in self.open.values() if not s.busy), None)
            if idle is None:
                raise HTTPError(
                    429,
                    f"this server holds at most {self.max_open} open sessions and each has a call "
                    "running: end sessions (POST /sessions/<id>/end) or retry later",
                )
            self._drop(
                idle,
                f"was evicted: this server holds at most {self.max_open} open sessions and it was the "
                "least recently used",
            )
            self.evicted += 1
        session.last_used = self.clock()
        self.open[sid] = session
        return session

    def touch(self, session: ChatSession) -> None:
        """``session`` was just used: it is now the most recently used, its idle time starts again."""
        session.last_used = self.clock()
        if session.session_id in self.open:
            self.open.move_to_end(session.session_id)

    def expire(self) -> int:
        """Drop the open sessions idle for more than ``ttl_s`` (none with a call running); how many."""
        if self.ttl_s is None:
            return 0
        now, dropped = self.clock(), 0
        for session in list(self.open.values()):
            if now - session.last_used <= self.ttl_s:
                break  # the rest were used later
            if not session.busy:
                self._drop(session, f"expired: it had no call for more than {self.ttl_s:g} s")
                dropped += 1
        self.expired += dropped
        return dropped

    def _drop(self, session: ChatSession, why: str) -> None:
        del self.open[session.session_id]
        self.gone[session.session_id] = why
        while len(self.gone) > self.keep_gone:
            self.gone.popitem(last=False)

    def find_open(self, session_id: str) -> ChatSession | None:
        """The open session ``session_id``; None when unknown; 400 when it has ended, 404 when it was dropped."""
        self.expire()
        session = self.open.get(session_id)
        if session is None:
            if session_id in self.ended:
                raise HTTPError(400, f"session {session_id} has ended")
            self._raise_gone(session_id)
        return session

    def _raise_gone(self, session_id: str) -> None:
        why = self.gone.get(session_id)
        if why is not None:
            raise HTTPError(404, f"session {session_id} {why}; start another session (another id)")

    def get(self, session_id: str) -> ChatSession | None:
        """An open or ended session; 404 for a dropped one; None when unknown."""
        self.expire()
        session = self.open.get(session_id) or self.ended.get(session_id)
        if session is None:
            self._raise_gone(session_id)
        return session

    def end(self, session_id: str, reward: float | None) -> ChatSession:
        self.expire()
        session = self.open.pop(session_id, None)
        if session is None:
            if session_id in self.ended:
                raise HTTPError(400, f"session {session_id} has already ended")
            self._raise_gone(session_id)
            raise HTTPError(404, f"no session {session_id}")
        session.end(reward)
        self.ended[session_id] = session
        while len(self.ended) > self.keep_ended:
            self.ended.popitem(last=False)
        return session

    def discard(self, session_id: str) -> None:
        self.open.pop(session_id, None)
        self.ended.pop(session_id, None)
