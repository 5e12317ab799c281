"""The calculator task: exact answers, large operands, disjoint deterministic splits, demonstrations."""

from __future__ import annotations

import pytest

from asyncrl.config import load_config
from asyncrl.config_parse import ConfigError
from asyncrl.data.calculator import demonstration, make_calculator_splits
from asyncrl.rollout.envs.calculator import calculator_reward, evaluate_expression
from asyncrl.types import Prompt


def test_problems_are_exact_large_and_split_disjointly() -> None:
    train, held = make_calculator_splits(3, 200, 40)
    assert len(train) == 200 and len(held) == 40
    assert not {p.question for p in train} & {p.question for p in held}
    assert make_calculator_splits(3, 200, 10)[0] == train  # the training side does not depend on eval_size
    for p in train + held:
        assert evaluate_expression(p.question) == p.answer  # the calculator tool agrees with the answer
        assert max(len(x) for x in p.question.replace("+", "*").replace("-", "*").split("*")) >= 3


def test_demonstration_is_a_correct_tool_conversation() -> None:
    (p,), _ = make_calculator_splits(0, 1, 0)
    demo = demonstration(p)
    assert [m["role"] for m in demo] == ["user", "assistant", "tool", "assistant"]
    assert demo[1]["content"] == f"<calc>{p.question}</calc>" and demo[2]["content"] == p.answer
    assert calculator_reward(Prompt(p.problem_id, (), p.answer), demo[3]["content"]) == 1.0


def _operands(question: str) -> list[str]:
    return question.lstrip("-").replace("+", "*").replace("-", "*").split("*")


@pytest.mark.parametrize("cap", [2, 3, 4])
def test_max_digits_caps_every_operand_and_keeps_the_splits_disjoint(cap: int) -> None:
    train, held = make_calculator_splits(3, 300, 60, max_digits=cap)
    assert not {p.question for p in train} & {p.question for p in held}
    lengths = {len(x) for p in train + held for x in _operands(p.question)}
    assert max(lengths) == cap and min(lengths) >= 2
    for p in train + held:
        assert evaluate_expression(p.question) == p.answer


def test_max_digits_zero_is_the_built_in_problem_set() -> None:
    assert make_calculator_splits(3, 50, 20, max_digits=0) == make_calculator_splits(3, 50, 20)
    assert max(len(x) for p in make_calculator_splits(3, 200, 0)[0] for x in _operands(p.question)) == 7


@pytest.mark.parametrize("bad", [1, 8, -1])
def test_max_digits_is_validated(bad: int) -> None:
    with pytest.raises(ConfigError, match="task.calculator_max_digits"):
        load_config(None, ["task.name=calculator", f"task.calculator_max_digits={bad}"])
