"""The ``calculator`` task: arithmetic on operands too large to work out in one's head.

Owns the problems of the multi-turn ``calculator`` environment (``rollout.envs.calculator``): a
question is an expression (``48213*379``, ``90817+4582*61``), its answer the exact integer. A tiny
model cannot multiply five-digit numbers token by token; it can learn to copy the expression into a
calculator call and the result into its answer. ``demonstration`` gives the worked conversation of a
problem (the call, the tool's result, the answer after ``#``) for a multi-turn warm start, or its direct
form (``#answer`` at once, no call: what a model never taught the tool does); ``demonstrates_call``
picks the form per problem, by a hash of its question, for a warm start that shows the tool on only a
share of its problems (``sft.tool_call_fraction``).

A problem's kind (``problem_kind``: the operation and the digits of each operand, ``mul 3x2``) is what
the held-out evaluation reports accuracy by: success depends on it far more than on the problem.

Splits follow the synthetic task's rule (``synthetic.is_held_out``: a hash of the seed and the
question), so held-out and training questions are disjoint for every size.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

from asyncrl.data.synthetic import is_held_out

__all__ = ["CalculatorProblem", "demonstrates_call", "demonstration", "make_calculator_splits", "problem_kind"]


@dataclass(frozen=True)
class CalculatorProblem:
    problem_id: str
    question: str
    """The expression to evaluate (what the model copies into its call)."""
    answer: str
    """The exact integer value."""


def _number(rng: random.Random, lo_digits: int, hi_digits: int, max_digits: int) -> int:
    if max_digits:
        lo_digits, hi_digits = min(lo_digits, max_digits), min(hi_digits, max_digits)
    digits = rng.randint(lo_digits, hi_digits)
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def _make_problem(rng: random.Random, problem_id: str, max_digits: int) -> CalculatorProblem:
    match rng.choice(("mul", "mul", "add_mul", "sub")):
        case "mul":
            a, b = _number(rng, 3, 5, max_digits), _number(rng, 2, 4, max_digits)
            expr, value = f"{a}*{b}", a * b
        case "add_mul":
            a, b, c = _number(rng, 4, 5, max_digits), _number(rng, 3, 4, max_digits), _number(rng, 2, 3, max_digits)
            expr, value = f"{a}+{b}*{c}", a + b * c
        case _:
            a, b = _number(rng, 5, 7, max_digits), _number(rng, 4, 6, max_digits)
            expr, value = f"{a}-{b}", a - b
    return CalculatorProblem(problem_id, expr, str(value))


_KINDS = (
    (re.compile(r"(\d+)\*(\d+)"), "mul {}x{}"),
    (re.compile(r"(\d+)\+(\d+)\*(\d+)"), "add_mul {}+{}x{}"),
    (re.compile(r"(\d+)-(\d+)"), "sub {}-{}"),
)


def problem_kind(question: str) -> str:
    """The kind of a calculator question: its operation (``mul``, ``add_mul``, ``sub``, as
    ``_make_problem`` draws them) and the digits of each operand: ``483*57`` -> ``mul 3x2``,
    ``294+448*496`` -> ``add_mul 3+3x3``, ``38521-4417`` -> ``sub 5-4``. Raises ``ValueError`` for
    anything else."""
    for pattern, name in _KINDS:
        match = pattern.fullmatch(question)
        if match:
            return name.format(*(len(operand) for operand in match.groups()))
    raise ValueError(f"not a calculator question: {question!r}")


def make_calculator_splits(
    seed: int, train_size: int, eval_size: int, max_digits: int = 0
) -> tuple[list[CalculatorProblem], list[CalculatorProblem]]:
    """Deterministic (train, held_out) problems, disjoint by ``is_held_out`` for any sizes. ``max_digits``
    (``task.calculator_max_digits``) caps every operand's digits; 0 keeps the built-in ranges (and the
    same problems as before the cap existed)."""

    def draw(stream: str, size: int, held_out: bool) -> list[CalculatorProblem]:
        rng = random.Random(f"{seed}-calculator-{stream}")
        out: list[CalculatorProblem] = []
        index = 0
        while len(out) < size:
            problem = _make_problem(rng, f"calc-{stream}-{index}", max_digits)
            index += 1
            if is_held_out(seed, problem.question) == held_out:
                out.append(problem)
        return out

    return draw("train", train_size, False), draw("eval", eval_size, True)


def demonstrates_call(question: str, fraction: float) -> bool:
    """Whether the warm start's demonstration of ``question`` calls the tool (else it answers directly),
    given the share ``fraction`` of problems that call it: a hash of the question mapped to [0, 1) falls
    below ``fraction``, so a problem always gets the same form, 1.0 gives every problem the call and 0.0
    none, and the share over many problems approaches ``fraction``."""
    digest = hashlib.sha256(f"tool-call\x00{question}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def demonstration(
    problem: CalculatorProblem, tool_role: str = "tool", call_text: str | None = None, *, calls_tool: bool = True
) -> list[dict[str, str]]:
    """The worked conversation: the question, the call, the result, the answer. ``call_text``: the
    call as the run's tool format writes it (default: the ``tag`` format, ``<calc>...</calc>``).
    ``calls_tool=False``: the direct form, the question and then the answer (``#answer``) with no call."""
    question = {"role": "user", "content": problem.question}
    answer = {"role": "assistant", "content": f"#{problem.answer}"}
    if not calls_tool:
        return [question, answer]
    return [
        question,
        {"role": "assistant", "content": call_text or f"<calc>{problem.question}</calc>"},
        {"role": tool_role, "content": problem.answer},
        answer,
    ]
