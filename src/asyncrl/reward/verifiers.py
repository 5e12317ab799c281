"""Verifier selection and the scoring functions run inside reward workers.

Owns :class:`Request` (what a worker needs to score one response), :class:`RemoteTarget` and
:func:`resolve_verifier`, the one explicit ``match`` from a verifier name to a function (math,
code, arithmetic, reasoning_gym, custom), a remote target or an LLM judge (``reward.judge``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from asyncrl.reward.judge import JudgeTarget

if TYPE_CHECKING:
    from asyncrl.reward.code import SandboxLimits


@dataclass(frozen=True)
class Request:
    """What a worker needs to score one response."""

    response: str
    reference: str
    prompt: str = ""
    row: dict[str, Any] | None = None
    math_timeout_s: float | None = 5.0
    code_timeout_s: float = 10.0
    code_limits: SandboxLimits | None = None


@dataclass(frozen=True)
class RemoteTarget:
    """A verifier computed by ``asyncrl serve reward`` on another host."""

    url: str
    """``http://host:port``; an optional ``#verifier`` suffix names the remote verifier."""


WorkerFn = Callable[[Request], tuple[float, str]]


def _score_math(req: Request) -> tuple[float, str]:
    from asyncrl.reward.math import math_reward

    return math_reward(req.response, req.reference, timeout_s=req.math_timeout_s), ""


def _score_code(req: Request) -> tuple[float, str]:
    from asyncrl.reward.code import build_program, run_code_tests

    row = req.row or {}
    entry_point = row.get("entry_point") if isinstance(row.get("entry_point"), str) else None
    prefix = row.get("prompt", "") if entry_point and isinstance(row.get("prompt"), str) else ""
    program = build_program(req.response, prefix=prefix, entry_point=entry_point)
    result = run_code_tests(program, req.reference, timeout_s=req.code_timeout_s, limits=req.code_limits)
    return (1.0 if result.passed else 0.0), result.status


def _score_arithmetic(req: Request) -> tuple[float, str]:
    from asyncrl.reward.arithmetic import arithmetic_reward

    return arithmetic_reward(req.response, req.reference), ""


def _score_reasoning_gym(req: Request) -> tuple[float, str]:
    from asyncrl.reward.reasoning_gym import reasoning_gym_reward

    return reasoning_gym_reward(req.response, req.row), ""


def _score_custom(spec: str, req: Request) -> tuple[float, str]:
    from asyncrl.reward.custom import call_custom_reward

    row = dict(req.row) if req.row is not None else {}
    row.setdefault("reference", req.reference)
    return call_custom_reward(spec, req.prompt, req.response, row), ""


def resolve_verifier(verifier: str) -> WorkerFn | RemoteTarget | JudgeTarget:
    """The one place a verifier name is chosen: a function run in a worker, or a remote target.

    ``math`` | ``code`` (reference = test code) | ``arithmetic`` | ``reasoning_gym`` (the row's reasoning-gym
    entry scored by its dataset's ``score_answer``) | ``custom:pkg.module:function``
    | ``remote:http://host:port[#verifier]`` | ``judge:http://host:port[/path][#model]`` (an LLM judge behind an
    OpenAI-compatible endpoint, ``reward.judge``). Raises ValueError for anything else.
    """
    match verifier.split(":", 1):
        case ["math"]:
            return _score_math
        case ["code"]:
            return _score_code
        case ["arithmetic"]:
            return _score_arithmetic
        case ["reasoning_gym"]:
            return _score_reasoning_gym
        case ["custom", spec] if spec.count(":") == 1 and all(spec.split(":")):
            return functools.partial(_score_custom, spec)
        case ["remote", url] if url.startswith(("http://", "https://")):
            return RemoteTarget(url)
        case ["judge", url] if url.startswith(("http://", "https://")):
            base, _, model = url.partition("#")
            return JudgeTarget(base, model or "default")
        case _:
            raise ValueError(
                f"unknown verifier {verifier!r}: use math, code, arithmetic, reasoning_gym, "
                "custom:pkg.module:function, remote:http://host:port or judge:http://host:port/v1[#model]"
            )
