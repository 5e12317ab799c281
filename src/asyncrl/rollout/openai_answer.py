"""The door's answer to one chat call, written out: its finished turns as OpenAI's JSON choices or as the
server-sent events of ``stream=true``.

Owns the writing only: ``rollout.openai_door`` generates the turns and reads each one (``Turn``: the reply
and what it was read from; ``Answer``: a call's turns and token counts), ``rollout.openai_chat`` holds the
shapes. ``answer_choice`` is one choice of the JSON answer (``message``, ``finish_reason``, ``logprobs``);
``stream_events`` the events (``chat.completion.chunk`` deltas token by token, calls, the ``finish_reason``,
the usage chunk of ``stream_options.include_usage``, ``[DONE]``), built from the finished turn (the engine
answers whole turns), and ``event_stream`` hands them to ``web.Stream``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from asyncrl.rollout.openai_chat import (
    Reply,
    TokenBytes,
    choice_deltas,
    chunk_response,
    sse,
    text_pieces,
    token_logprobs,
)
from asyncrl.rollout.openai_request import ChatRequest
from asyncrl.rollout.tools import ParsedTurn

__all__ = ["Answer", "Turn", "answer_choice", "event_stream", "stream_events"]


@dataclass(frozen=True)
class Turn:
    """One choice: the reply and what it was read from."""

    reply: Reply
    text: str
    parsed: ParsedTurn
    closed_by: int | None
    lead: str
    """The call's opening the door wrote for the model (``tool_choice`` required or named), else empty."""
    ids: tuple[int, ...]
    """The model's tokens of the text (without the stop token it ended at)."""
    logprobs: tuple[float, ...]


@dataclass(frozen=True)
class Answer:
    turns: list[Turn]
    prompt_tokens: int
    produced: int
    completion_id: str | None = None
    """A branching session's id of the recorded completion (the answer's ``id``)."""


def answer_choice(token_bytes: TokenBytes, index: int, turn: Turn, logprobs: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": index,
        "message": turn.reply.message,
        "finish_reason": turn.reply.finish_reason,
    }
    choice["logprobs"] = token_logprobs(token_bytes, turn.ids, turn.logprobs) if logprobs else None
    return choice


def stream_events(
    req: ChatRequest, answer: Answer, model_name: str, tokenizer: Any, token_bytes: TokenBytes
) -> list[bytes]:
    """The answer as server-sent events (``chat.completion.chunk``; the usage chunk; ``[DONE]``)."""
    chunk_id = answer.completion_id or f"chatcmpl-{uuid.uuid4().hex}"
    created, model = int(time.time()), req.model or model_name
    usage = {"usage": None} if req.include_usage else {}
    events = []
    for i, turn in enumerate(answer.turns):
        entries = [token_bytes.entry(t, lp) for t, lp in zip(turn.ids, turn.logprobs, strict=True)]
        pieces = [(turn.lead, [])] if turn.lead else []
        pieces += [(p, [e]) for p, e in zip(text_pieces(tokenizer, turn.ids), entries, strict=True)]
        for delta in choice_deltas(i, turn.reply, pieces, req.logprobs):
            events.append(sse(chunk_response(chunk_id, created, model, [delta]) | usage))
    if req.include_usage:
        tokens = {
            "prompt_tokens": answer.prompt_tokens,
            "completion_tokens": answer.produced,
            "total_tokens": answer.prompt_tokens + answer.produced,
        }
        events.append(sse(chunk_response(chunk_id, created, model, [], tokens)))
    return [*events, sse("[DONE]")]


async def event_stream(events: list[bytes]) -> AsyncGenerator[bytes, None]:
    for event in events:
        yield event
