"""The synthetic verifiable reasoning task of the embedded default: multi-step arithmetic.

A problem is a chain of additions and subtractions, ``12+7-5+3``; the response writes one
scratchpad step per operation and the final answer after ``#``::

    12+7=19;19-5=14;14+3=17;#17

The number of operands is drawn from a long-tailed distribution (2 plus a geometric number of
extra operands, capped at ``max_terms``), so most responses are short and a few are long, like
the outputs of reasoning models. ``teacher_solution`` gives the warm start's demonstrations,
optionally from a flawed teacher (see its docstring). Running totals stay in ``[0, 10 * max_operand]``. Problems are
generated from a fixed seed; the held-out split has distinct questions and train never contains
a held-out question, while both follow the same length distribution.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class ArithmeticProblem:
    """One problem: the question text, the worked response and the final answer."""

    problem_id: str
    question: str
    solution: str
    answer: str
    num_terms: int


def _make_problem(
    rng: random.Random, problem_id: str, max_terms: int, tail: float, max_operand: int
) -> ArithmeticProblem:
    num_terms = 2
    while num_terms < max_terms and rng.random() < tail:
        num_terms += 1
    ceiling = 10 * max_operand
    total = rng.randint(0, max_operand)
    question = str(total)
    steps = []
    for _ in range(num_terms - 1):
        operand = rng.randint(0, max_operand)
        if total - operand >= 0 and (total + operand > ceiling or rng.random() < 0.5):
            new_total, op = total - operand, "-"
        else:
            new_total, op = total + operand, "+"
        question += f"{op}{operand}"
        steps.append(f"{total}{op}{operand}={new_total};")
        total = new_total
    solution = "".join(steps) + f"#{total}"
    return ArithmeticProblem(problem_id, question, solution, str(total), num_terms)


def teacher_solution(problem: ArithmeticProblem, rng: random.Random, slip_rate: float) -> str:
    """A demonstration from a flawed teacher: with probability ``slip_rate`` the worked steps are
    right but the final answer repeats the running total *before* the last operation (a slip a
    weak teacher makes). Imitation copies the slip; the verifier's reward lets RL unlearn it."""
    if slip_rate <= 0 or rng.random() >= slip_rate:
        return problem.solution
    steps = problem.solution.split(";")[:-1]
    previous = steps[-1].split("=")[0]
    for op in "+-":
        if op in previous[1:]:
            previous = previous[: previous.index(op, 1)]
            break
    return ";".join(steps) + f";#{previous}"


def make_splits(
    seed: int, train_size: int, eval_size: int, *, max_terms: int = 8, tail: float = 0.5, max_operand: int = 9
) -> tuple[list[ArithmeticProblem], list[ArithmeticProblem]]:
    """Deterministic (train, held_out) splits from the same length distribution.

    The held-out split is drawn first from its own seed stream (distinct questions), then train
    is drawn from another stream skipping any question in held-out, so no held-out question is
    ever trained on while both splits keep the long-tailed length distribution (drawing held-out
    second and skipping train questions would bias it toward long problems: short questions
    are few and all occur in a large train set)."""
    eval_rng = random.Random(f"{seed}-eval")
    held_out: list[ArithmeticProblem] = []
    seen: set[str] = set()
    index = 0
    while len(held_out) < eval_size:
        problem = _make_problem(eval_rng, f"eval-{index}", max_terms, tail, max_operand)
        index += 1
        if problem.question not in seen:
            seen.add(problem.question)
            held_out.append(problem)
    train_rng = random.Random(f"{seed}-train")
    train: list[ArithmeticProblem] = []
    index = 0
    while len(train) < train_size:
        problem = _make_problem(train_rng, f"train-{index}", max_terms, tail, max_operand)
        index += 1
        if problem.question not in seen:
            train.append(problem)
    return train, held_out
