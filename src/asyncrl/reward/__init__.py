"""Reward verifiers and the reward service (DESIGN §1 "Reward service").

This package owns the verifiers (``math``: final-answer equivalence with math-verify; ``code``:
tests run in a sandboxed subprocess; ``custom``: a user function; ``remote``: another host) and the
:class:`~asyncrl.reward.service.RewardService` that runs them in an isolated process pool with hard
timeouts. ``arithmetic`` (the synthetic-task verifier) lives in ``arithmetic.py``, owned elsewhere.

Importing this package is cheap: the public names below load their module on first use, and
math-verify/sympy load only inside the worker processes that need them.

Errors shared by the modules are defined here. A verifier that cannot reach a verdict raises one
of them; it never returns a reward of 0 in its place.
"""

from __future__ import annotations

import importlib
from typing import Any


class VerifierTimeout(Exception):
    """The verifier ran out of time before reaching a verdict (not the same as a wrong answer)."""


class InfrastructureError(RuntimeError):
    """The machinery around a verifier failed (sandbox could not start, network error, ...).
    The service retries these; it never retries a verdict."""


_LAZY = {
    "math_reward": "asyncrl.reward.math",
    "extract_answer": "asyncrl.reward.math",
    "run_code_tests": "asyncrl.reward.code",
    "CodeResult": "asyncrl.reward.code",
    "SandboxLimits": "asyncrl.reward.code",
    "SandboxError": "asyncrl.reward.code",
    "build_program": "asyncrl.reward.code",
    "RewardService": "asyncrl.reward.service",
    "RewardResult": "asyncrl.reward.service",
    "load_custom_reward": "asyncrl.reward.custom",
    "serve_reward": "asyncrl.reward.remote",
    "RewardServer": "asyncrl.reward.remote",
    "RemoteRewardClient": "asyncrl.reward.remote",
}

__all__ = ["InfrastructureError", "VerifierTimeout", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'asyncrl.reward' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
