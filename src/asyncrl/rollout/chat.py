"""Environment turns as token ids, through the tokenizer's own chat template; model tokens untouched.

Owns the one place where text becomes ids in a multi-turn episode. The model's tokens are never
rendered, decoded-and-re-encoded or re-tokenised: the workflow appends them exactly as sampled. What
comes between two model turns (the end of the model's turn when it did not sample it, the tool
results or user turn, the next turn's header) is taken from the chat template as the difference
between two renderings of the conversation:

1. render the conversation so far with the latest assistant message replaced by a sentinel, plus
   the environment's new messages, with the generation prompt;
2. the environment's text is everything after the sentinel (the template's closing of the assistant
   turn, the new messages, the glue, the generation prompt);
3. when the model ended its turn by sampling an end-of-turn token (``<|im_end|>``, ``<|eot_id|>``,
   ``<eos>``), the template's own closing of the turn is already in the sequence: it is dropped from
   the front of that text (after any whitespace the template puts before it);
4. the text is encoded alone (no special tokens added) and appended.

So the trained sequence is always exactly: the opening's ids, then model ids as sampled, then
environment ids, and so on; and what the engine conditions on at every turn is that same sequence.
Whatever the template does to earlier messages (trimming, dropping reasoning) cannot change
tokens already in the sequence. A template that renders an environment message to nothing
(e.g. no branch for the ``tool`` role) is an error, not a silently missing tool result.

``demonstration_ids`` builds a worked conversation (a warm start's example) the same way, with its
loss mask on the assistant turns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from asyncrl.rollout.envs.base import Message

__all__ = ["ChatRenderer", "SENTINEL", "demonstration_ids"]

SENTINEL = "ASYNCRLTURNEND7c1f"
"""Stands for the latest assistant turn while rendering (plain ASCII, no spaces: survives ``trim``)."""


class ChatRenderer:
    """Renders an episode's opening and its environment turns with ``tokenizer``'s chat template."""

    def __init__(self, tokenizer: Any, end_of_turn_ids: Sequence[int] = ()) -> None:
        """``end_of_turn_ids``: tokens that end a model turn (the sampling stop tokens; the EOS by
        default)."""
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("multi-turn episodes need a tokenizer with a chat template")
        self.tokenizer = tokenizer
        ids = tuple(int(i) for i in end_of_turn_ids)
        if not ids and tokenizer.eos_token_id is not None:
            ids = (int(tokenizer.eos_token_id),)
        self.end_of_turn_ids = ids
        self._closers = {i: tokenizer.decode([i], skip_special_tokens=False) for i in ids}

    def _render(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> str:
        text = self.tokenizer.apply_chat_template(
            [m.as_dict() for m in messages],
            tools=list(tools) or None,
            add_generation_prompt=True,
            tokenize=False,
        )
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not str")
        return text

    def encode(self, text: str) -> tuple[int, ...]:
        return tuple(int(t) for t in self.tokenizer.encode(text, add_special_tokens=False))

    def opening_ids(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] = ()) -> tuple[int, ...]:
        """The ids of the opening conversation with the generation prompt."""
        return self.encode(self._render(messages, tools))

    def env_text(
        self,
        history: Sequence[Message],
        new: Sequence[Message],
        tools: Sequence[dict[str, Any]] = (),
        closed_by: int | None = None,
    ) -> str:
        """The text between the model's latest turn and its next one (see the module docstring).

        ``history``: the conversation before the latest assistant turn; ``new``: the environment's
        messages; ``closed_by``: the end-of-turn token the model sampled last, or None."""
        text = self._render([*history, Message("assistant", SENTINEL), *new], tools)
        at = text.rfind(SENTINEL)
        if at < 0:
            raise ValueError("the chat template does not render assistant messages")
        tail = text[at + len(SENTINEL) :]
        if closed_by is not None:
            tail = self._drop_closer(tail, closed_by)
        for m in new:
            if m.content.strip() and m.content.strip() not in tail:
                raise ValueError(
                    f"the chat template renders no {m.role!r} message (its content is missing from the "
                    "rendered conversation): add that role to the template"
                )
        return tail

    def _drop_closer(self, tail: str, closed_by: int) -> str:
        """``tail`` without the turn's closing text the model already sampled as ``closed_by``."""
        lead = tail.lstrip()
        own = self._closers.get(closed_by)
        if own is None:
            own = self.tokenizer.decode([closed_by], skip_special_tokens=False)
        for closer in (own, *sorted(self._closers.values(), key=len, reverse=True)):
            if closer and lead.startswith(closer):
                return lead[len(closer) :]
        return tail

    def env_ids(
        self,
        history: Sequence[Message],
        new: Sequence[Message],
        tools: Sequence[dict[str, Any]] = (),
        closed_by: int | None = None,
    ) -> tuple[int, ...]:
        """``env_text`` encoded alone: the environment segment's ids."""
        return self.encode(self.env_text(history, new, tools, closed_by))


def demonstration_ids(
    renderer: ChatRenderer, messages: Sequence[Message], tools: Sequence[dict[str, Any]] = ()
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(token ids, loss mask)`` of a worked conversation (a multi-turn warm start's example): built
    exactly as an episode builds its sequence, each assistant message encoded and closed by the first
    end-of-turn token (mask 1), everything else the template's (mask 0). So a policy warm-started on
    it sees the glue it will see in its episodes."""
    first = next((i for i, m in enumerate(messages) if m.role == "assistant"), None)
    if first is None or first == 0:
        raise ValueError("a demonstration needs an opening message before its first assistant message")
    if not renderer.end_of_turn_ids:
        raise ValueError("a demonstration needs an end-of-turn token to close assistant turns")
    eot = renderer.end_of_turn_ids[0]
    ids = list(renderer.opening_ids(messages[:first], tools))
    mask = [0] * len(ids)
    history = list(messages[:first])
    i = first
    while i < len(messages):
        turn = renderer.encode(messages[i].content) + (eot,)
        ids += turn
        mask += [1] * len(turn)
        j = i + 1
        while j < len(messages) and messages[j].role != "assistant":
            j += 1
        if j < len(messages):  # environment messages, then the next assistant turn
            env = renderer.env_ids(history, messages[i + 1 : j], tools, closed_by=eot)
            ids += env
            mask += [0] * len(env)
        history += messages[i:j]
        i = j
    return tuple(ids), tuple(mask)
