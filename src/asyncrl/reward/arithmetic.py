"""Verifier of the synthetic arithmetic task: exact match of the final ``#<integer>``.

Pure and cheap (a regular expression); the reward service may run it inline or in its pool.
"""

from __future__ import annotations

import re

_FINAL = re.compile(r"#(-?\d+)")


def extract_final(response: str) -> str | None:
    """The integer after the last ``#`` in the response, or None when there is none."""
    matches = _FINAL.findall(response)
    return matches[-1] if matches else None


def arithmetic_reward(response: str, answer: str) -> float:
    """1.0 when the response's final ``#n`` equals ``answer`` as an integer, else 0.0."""
    found = extract_final(response)
    if found is None:
        return 0.0
    try:
        return 1.0 if int(found) == int(answer.strip()) else 0.0
    except ValueError:
        return 0.0
