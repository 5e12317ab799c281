"""A reward that varies on the random-init tiny policy's output (so advantages and losses are not
all zero), importable by reward workers in other processes as ``tests.launch.rewards:even_length``."""

from __future__ import annotations

from typing import Any


def even_length(prompt: str, completion: str, row: dict[str, Any]) -> float:
    """1.0 for a response of even length, else 0.0."""
    return float(len(completion) % 2 == 0)
