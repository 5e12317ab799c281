"""Reward verifiers and the reward service (DESIGN §1 "Reward service").

This package owns the verifiers (``math``: final-answer equivalence with math-verify; ``code``:
tests run in a sandboxed subprocess; ``custom``: a user function; rewards computed on another host
through ``client``, served there by ``remote``) and the :class:`~asyncrl.reward.service.RewardService`
that runs them in an isolated process pool with hard timeouts. ``arithmetic`` (the synthetic-task
verifier) lives in ``arithmetic.py``, owned elsewhere.

Importing this package is cheap: it defines the errors below and nothing else (import a verifier
from its module), and math-verify/sympy load only inside the worker processes that need them.

Errors shared by the modules are defined here. A verifier that cannot reach a verdict raises one
of them; it never returns a reward of 0 in its place.
"""

from __future__ import annotations

__all__ = ["InfrastructureError", "VerifierTimeout"]


class VerifierTimeout(Exception):
    """The verifier ran out of time before reaching a verdict (not the same as a wrong answer)."""


class InfrastructureError(RuntimeError):
    """The machinery around a verifier failed (sandbox could not start, network error, ...).
    The service retries these; it never retries a verdict."""
