"""The ``reasoning_gym`` verifier: a response scored by its reasoning-gym dataset's own ``score_answer``.

Runs in a reward worker (``verifiers.resolve_verifier``). The row is the prompt's meta, which holds the
reasoning-gym entry (``question``, ``answer``, ``metadata``; put there by ``data.reasoning_gym``, whose
``ENTRY_KEY`` is repeated here: reward imports no data code). The answer handed to ``score_answer`` is
the text inside the response's last ``<answer>...</answer>`` (reasoning-gym's convention), else the
whole response stripped. The scoring function is the one reasoning-gym registers for the entry's source
dataset (``reasoning_gym.get_score_answer_fn``: the dataset's class at its default configuration), loaded
once per worker process. Its reward (in [0, 1], partial credit where the dataset gives it) is checked
like a custom reward's: a non-number, a non-finite value or an exception is a failure, never a 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncrl.reward.custom import to_reward

__all__ = ["ENTRY_KEY", "reasoning_gym_reward", "response_answer"]

ENTRY_KEY = "reasoning_gym_entry"
"""The row key of the reasoning-gym entry (``data.reasoning_gym.ENTRY_KEY``)."""

_score_fns: dict[str, Callable[[str | None, dict[str, Any]], float]] = {}


def response_answer(response: str) -> str:
    """The answer a response gives (see the module docstring)."""
    from reasoning_gym.utils import extract_answer

    tagged = extract_answer(response, tag_name="answer", strip=True)
    return tagged if tagged is not None else response.strip()


def reasoning_gym_reward(response: str, row: dict[str, Any] | None) -> float:
    """The reward of ``response`` by the ``score_answer`` of the dataset of ``row``'s entry."""
    entry = (row or {}).get(ENTRY_KEY)
    if not isinstance(entry, dict) or not isinstance(entry.get("metadata"), dict):
        raise ValueError("verifier reasoning_gym needs the prompts of task.name=reasoning_gym (no entry in the row)")
    source = str(entry["metadata"].get("source_dataset", ""))
    fn = _score_fns.get(source)
    if fn is None:
        import reasoning_gym

        fn = _score_fns[source] = reasoning_gym.get_score_answer_fn(source)
    return to_reward(fn(response_answer(response), entry), f"reasoning-gym {source}.score_answer")
