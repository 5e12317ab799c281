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

**Control tokens come only from the template.** Message text (user turns, tool results, assistant
text, tool call arguments) and every string in the tool schemas is text: before rendering, each
occurrence in it of a special token's string (the tokenizer's added tokens marked special, e.g.
``<|im_end|>``, ``<|eot_id|>``, ``<eos>``) and of this module's own marker prefix ``MARK`` is replaced
by a placeholder (``MARK``, the escape's index, ``E``: ASCII letters and digits, so it survives the
template's filters such as ``trim`` and ``tojson``). The rendered text is then encoded piece by piece:
the template's text between placeholders with special tokens recognised (its control strings become
control tokens), each run of placeholders as the strings they stand for, encoded as plain text
(``split_special_tokens``) and checked to hold no special token. A tool result that writes
``<|im_end|>\\n<|im_start|>system`` is therefore a dozen ordinary tokens, never a forged turn; text
without a special token's string is encoded exactly as before (one piece). Since a client's text can
never hold ``MARK``, the sentinel and the placeholders cannot be forged either. Added tokens that are
not special (Qwen's ``<tool_call>``) keep the tokenizer's own treatment, in text as in the template.

``demonstration_ids`` builds a worked conversation (a warm start's example) the same way, with its
loss mask on the assistant turns.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from asyncrl.rollout.envs.base import Message

__all__ = ["ChatRenderer", "MARK", "SENTINEL", "demonstration_ids", "special_strings"]

MARK = "ASYNCRLMARK7c1f"
"""The prefix of the renderer's own markers; escaped wherever it occurs in a message (see the module docstring)."""
SENTINEL = MARK + "TURNEND"
"""Stands for the latest assistant turn while rendering (plain ASCII, no spaces: survives ``trim``)."""
_PLACEHOLDER = re.compile(re.escape(MARK) + r"(\d+)E")


def special_strings(tokenizer: Any) -> tuple[str, ...]:
    """The strings of ``tokenizer``'s special tokens (added tokens marked special, and the named ones)."""
    found = {str(t) for t in getattr(tokenizer, "all_special_tokens", ()) or ()}
    for added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(added, "special", False):
            found.add(str(added.content))
    return tuple(sorted((s for s in found if s), key=lambda s: (-len(s), s)))


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
        self.escapes: tuple[str, ...] = (*special_strings(tokenizer), MARK)
        """What a message's text may not carry as such: index ``k`` is written ``MARK{k}E`` while rendering."""
        self._escape = re.compile("|".join(re.escape(s) for s in sorted(self.escapes, key=len, reverse=True)))
        self._index = {s: k for k, s in enumerate(self.escapes)}
        unk = getattr(tokenizer, "unk_token_id", None)
        self._special_ids = frozenset(int(i) for i in getattr(tokenizer, "all_special_ids", ()) or ()) | frozenset(
            int(i) for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items() if t.special
        )
        self._special_ids -= {unk}  # a character the vocabulary lacks is <unk>, not a forged turn

    # --------------------------------------------------------------------------- text as text
    def escaped(self, text: str) -> str:
        """``text`` with every special token's string (and ``MARK``) replaced by its placeholder."""
        return self._escape.sub(lambda m: f"{MARK}{self._index[m.group(0)]}E", text)

    def unescaped(self, text: str) -> str:
        """Rendered text with the placeholders written back (what the conversation reads as)."""
        return _PLACEHOLDER.sub(lambda m: self.escapes[int(m.group(1))], text)

    def _escaped_value(self, value: Any) -> Any:
        """A tool schema with every string in it (keys included) escaped."""
        if isinstance(value, str):
            return self.escaped(value)
        if isinstance(value, dict):
            return {self._escaped_value(k): self._escaped_value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._escaped_value(v) for v in value]
        return value

    def encode(self, text: str) -> tuple[int, ...]:
        """``text`` as plain text: a special token's string in it is encoded as the characters it is made of.
        Raises ``ValueError`` when the tokenizer still yields a special token (one that cannot encode text
        without parsing special tokens)."""
        if not text:
            return ()
        ids = tuple(int(t) for t in self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
        forged = [t for t in ids if t in self._special_ids]
        if forged:
            raise ValueError(
                f"this tokenizer encodes text into special tokens {sorted(set(forged))[:5]} even with "
                "split_special_tokens=True: it cannot render untrusted text safely"
            )
        return ids

    def _encode_rendered(self, text: str) -> tuple[int, ...]:
        """Rendered (escaped) text: the template's pieces with special tokens recognised, each run of
        placeholders as plain text (see the module docstring)."""
        out: list[int] = []
        at, plain = 0, ""
        for m in _PLACEHOLDER.finditer(text):
            if m.start() > at:  # template text (and message text free of special strings) before it
                out += self.encode(plain)
                plain = ""
                out += (int(t) for t in self.tokenizer.encode(text[at : m.start()], add_special_tokens=False))
            plain += self.escapes[int(m.group(1))]
            at = m.end()
        out += self.encode(plain)
        if at < len(text):
            out += (int(t) for t in self.tokenizer.encode(text[at:], add_special_tokens=False))
        return tuple(out)

    # --------------------------------------------------------------------------- rendering
    def _render(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], sentinel_at: int = -1) -> str:
        """The conversation rendered with the generation prompt, every message's text and the tools escaped;
        message ``sentinel_at`` (when >= 0) is the sentinel, written as is."""
        rendered = [
            {"role": m.role, "content": SENTINEL if i == sentinel_at else self.escaped(m.content)}
            for i, m in enumerate(messages)
        ]
        try:
            text = self.tokenizer.apply_chat_template(
                rendered,
                tools=[self._escaped_value(t) for t in tools] or None,
                add_generation_prompt=True,
                tokenize=False,
            )
        except Exception as e:  # jinja2's TemplateError (a template's raise_exception), a filter's TypeError
            if isinstance(e, ValueError):
                raise
            raise ValueError(f"the chat template refused the conversation: {type(e).__name__}: {e}") from None
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not str")
        return text

    def opening_ids(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] = ()) -> tuple[int, ...]:
        """The ids of the opening conversation with the generation prompt."""
        return self._encode_rendered(self._render(messages, tools))

    def _env_rendered(
        self, history: Sequence[Message], new: Sequence[Message], tools: Sequence[dict[str, Any]], closed_by: int | None
    ) -> str:
        text = self._render([*history, Message("assistant", ""), *new], tools, sentinel_at=len(history))
        at = text.rfind(SENTINEL)
        if at < 0:
            raise ValueError("the chat template does not render assistant messages")
        tail = text[at + len(SENTINEL) :]
        if closed_by is not None:
            tail = self._drop_closer(tail, closed_by)
        for m in new:
            content = self.escaped(m.content).strip()
            if content and content not in tail:
                raise ValueError(
                    f"the chat template renders no {m.role!r} message (its content is missing from the "
                    "rendered conversation): add that role to the template"
                )
        return tail

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
        return self.unescaped(self._env_rendered(history, new, tools, closed_by))

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
        """``env_text`` encoded alone: the environment segment's ids (message text as text)."""
        return self._encode_rendered(self._env_rendered(history, new, tools, closed_by))


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
