"""Reasoning in a model turn: the ``<think>…</think>`` block of Qwen3 and DeepSeek-R1, split from the rest.

Qwen3's template writes an assistant turn as ``<think>\\nREASONING\\n</think>\\n\\nCONTENT`` (its generation
prompt may already hold ``<think>\\n\\n</think>\\n\\n`` when thinking is off); DeepSeek-R1 writes
``<think>\\nREASONING\\n</think>\\n\\nCONTENT``, and its later templates open the block in the generation
prompt, so the turn holds only ``</think>``. ``split_reasoning`` gives the reasoning (newlines around it
stripped, as Qwen3's template strips them) and the rest (leading newlines stripped). A turn with no
``</think>``: for a family whose prompt opens the block (``opened_by_prompt``) the whole turn is
reasoning cut short; else a turn that opens ``<think>`` and never closes it is reasoning cut short, and
any other turn has no reasoning.
"""

from __future__ import annotations

__all__ = ["THINK_CLOSE", "THINK_OPEN", "split_reasoning"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def split_reasoning(text: str, opened_by_prompt: bool) -> tuple[str | None, str]:
    """``(reasoning or None, the rest of the turn)``."""
    end = text.find(THINK_CLOSE)
    if end < 0:
        opened = text.lstrip().startswith(THINK_OPEN)
        if opened or opened_by_prompt:
            body = text.lstrip()[len(THINK_OPEN) :] if opened else text
            return body.strip("\n"), ""
        return None, text
    head = text[:end]
    start = head.find(THINK_OPEN)
    reasoning = head[start + len(THINK_OPEN) :] if start >= 0 else head
    return reasoning.strip("\n"), text[end + len(THINK_CLOSE) :].lstrip("\n")
