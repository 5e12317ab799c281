"""The synthetic verifiable reasoning tasks of the embedded default: multi-step arithmetic.

Two forms, each a long-tailed number of written steps ending in the final answer after ``#``:

- ``chain`` (the default): a chain of additions and subtractions, one scratchpad step per
  operation. ``12+7-5+3`` -> ``12+7=19;19-5=14;14+3=17;#17``. Running totals stay in
  ``[0, 10 * max_operand]``. Each step must find its operand in the question, which a tiny model
  does reliably only for short chains.
- ``repeat``: a product modulo 10 worked out as repeated addition, counting down.
  ``7*4%10`` -> ``4:7;3:4;2:1;1:8;#8`` (line ``c:t``: ``c`` operations left, running total ``t``).
  Every step needs only the line before it and the question's first digit, so a tiny model can
  keep a long chain right: the form of the generation-bound *and* learnable workload
  (``python -m benchmarks headline``), whose responses run to hundreds or thousands of tokens.

The number of steps is drawn from a long-tailed distribution (2 plus a geometric number of
extra steps, capped at ``max_terms``), so most responses are short and a few are long, like the
outputs of reasoning models. ``teacher_solution`` gives the warm start's demonstrations,
optionally from a flawed teacher (see its docstring).

Splits: a question belongs to the held-out side or to the training side by a hash of the task
seed and the question text (``is_held_out``: one question in ``HELD_OUT_EVERY``), fixed before any
size is chosen. Held-out problems are drawn from one seeded stream keeping held-out questions,
training problems from another keeping the rest; both draw from the same generator, so they
share its length distribution, and they are disjoint for every ``eval_size`` and ``train_size``
(the training split does not depend on ``eval_size`` at all). A question may repeat within a
split, as it does in the task's own distribution.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from asyncrl.choices import ArithmeticForm, choice_error


@dataclass(frozen=True)
class ArithmeticProblem:
    """One problem: the question text, the worked response and the final answer."""

    problem_id: str
    question: str
    solution: str
    answer: str
    num_terms: int


HELD_OUT_EVERY = 8
"""One question in this many belongs to the held-out side (by hash, see ``is_held_out``)."""


def is_held_out(seed: int, question: str) -> bool:
    """Whether ``question`` belongs to the held-out side of the task with this seed: a hash of the
    two, so the partition is fixed before any split size is chosen."""
    digest = hashlib.sha256(f"{seed}\x00{question}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % HELD_OUT_EVERY == 0


def _num_steps(rng: random.Random, max_terms: int, tail: float) -> int:
    """2 plus a geometric number of extra terms (P(one more) = ``tail``), capped at ``max_terms``."""
    num_terms = 2
    while num_terms < max_terms and rng.random() < tail:
        num_terms += 1
    return num_terms


def _make_chain(
    rng: random.Random, problem_id: str, max_terms: int, tail: float, max_operand: int
) -> ArithmeticProblem:
    num_terms = _num_steps(rng, max_terms, tail)
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


def _make_repeat(rng: random.Random, problem_id: str, max_terms: int, tail: float) -> ArithmeticProblem:
    """``a*n%10`` worked as n lines ``c:t`` (c = operations left, t = running total mod 10)."""
    count = _num_steps(rng, max_terms, tail)
    factor = rng.randint(1, 9)
    lines = [f"{count - k}:{(k + 1) * factor % 10};" for k in range(count)]
    answer = str(count * factor % 10)
    return ArithmeticProblem(problem_id, f"{factor}*{count}%10", "".join(lines) + f"#{answer}", answer, count)


def _make_problem(
    rng: random.Random, problem_id: str, max_terms: int, tail: float, max_operand: int, form: ArithmeticForm = "chain"
) -> ArithmeticProblem:
    match form:
        case "chain":
            return _make_chain(rng, problem_id, max_terms, tail, max_operand)
        case "repeat":
            return _make_repeat(rng, problem_id, max_terms, tail)
        case other:
            raise choice_error(other, ArithmeticForm, "task.form")


def _before_last_step(problem: ArithmeticProblem) -> str:
    """The running total before the last operation (what a slipping teacher answers)."""
    last_step = problem.solution.split(";")[-2]
    if ":" in last_step:  # repeat: the total of the line before the last one
        return problem.solution.split(";")[-3].split(":")[1]
    previous = last_step.split("=")[0]
    for op in "+-":
        if op in previous[1:]:
            return previous[: previous.index(op, 1)]
    return previous


def teacher_solution(problem: ArithmeticProblem, rng: random.Random, slip_rate: float) -> str:
    """A demonstration from a flawed teacher: with probability ``slip_rate`` the worked steps are
    right but the final answer repeats the running total *before* the last operation (a slip a
    weak teacher makes). Imitation copies the slip; the verifier's reward lets RL unlearn it."""
    if slip_rate <= 0 or rng.random() >= slip_rate:
        return problem.solution
    steps = problem.solution.split(";")[:-1]
    return ";".join(steps) + f";#{_before_last_step(problem)}"


def make_splits(
    seed: int,
    train_size: int,
    eval_size: int,
    *,
    max_terms: int = 8,
    tail: float = 0.5,
    max_operand: int = 9,
    form: ArithmeticForm = "chain",
) -> tuple[list[ArithmeticProblem], list[ArithmeticProblem]]:
    """Deterministic (train, held_out) splits: disjoint by ``is_held_out`` for any sizes, each drawn
    from its own seeded stream of the same generator (so the same length distribution), and the
    training split independent of ``eval_size``."""

    def draw(stream: str, size: int, held_out: bool) -> list[ArithmeticProblem]:
        rng = random.Random(f"{seed}-{stream}")
        out: list[ArithmeticProblem] = []
        index = 0
        while len(out) < size:
            if index > 1000 * (size + 1):  # a question space with no question on this side (tiny tasks)
                side = "held-out" if held_out else "training"
                raise ValueError(
                    f"task.form={form}: no {side} question found in {index} draws; the question space of "
                    f"max_terms={max_terms}, max_operand={max_operand} is too small to split"
                )
            problem = _make_problem(rng, f"{stream}-{index}", max_terms, tail, max_operand, form)
            index += 1
            if is_held_out(seed, problem.question) == held_out:
                out.append(problem)
        return out

    return draw("train", train_size, False), draw("eval", eval_size, True)
