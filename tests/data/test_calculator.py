"""The calculator task: exact answers, large operands, disjoint deterministic splits, demonstrations."""

from __future__ import annotations

import pytest

from asyncrl.config import load_config
from asyncrl.config.parse import ConfigError
from asyncrl.data.calculator import demonstrates_call, demonstration, make_calculator_splits, problem_kind
from asyncrl.rollout.envs.calculator import calculator_reward, evaluate_expression
from asyncrl.types import KIND_KEY, Prompt


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


def test_the_direct_demonstration_answers_at_once_and_right() -> None:
    (p,), _ = make_calculator_splits(0, 1, 0)
    demo = demonstration(p, calls_tool=False)
    assert [m["role"] for m in demo] == ["user", "assistant"] and demo[0]["content"] == p.question
    assert demo[1]["content"] == f"#{p.answer}"
    assert calculator_reward(Prompt(p.problem_id, (), p.answer), demo[1]["content"]) == 1.0


@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.5, 0.9])
def test_the_share_of_problems_that_call_follows_the_fraction(fraction: float) -> None:
    train, _ = make_calculator_splits(0, 4000, 0, max_digits=3)
    questions = sorted({p.question for p in train})
    calls = [demonstrates_call(q, fraction) for q in questions]
    assert abs(sum(calls) / len(calls) - fraction) < 0.03  # 4000 draws: 3 points is > 4 standard errors
    assert calls == [demonstrates_call(q, fraction) for q in questions]  # the same problem, the same form
    lower = [demonstrates_call(q, fraction / 2) for q in questions]
    assert all(c for c, low in zip(calls, lower, strict=True) if low)  # a smaller share calls on a subset


def test_fraction_one_calls_on_every_problem_and_zero_on_none() -> None:
    train, _ = make_calculator_splits(0, 500, 0)
    assert all(demonstrates_call(p.question, 1.0) for p in train)
    assert not any(demonstrates_call(p.question, 0.0) for p in train)


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_tool_call_fraction_is_validated(bad: float) -> None:
    with pytest.raises(ConfigError, match="sft.tool_call_fraction"):
        load_config(None, ["task.name=calculator", "rollout.workflow=agent", f"sft.tool_call_fraction={bad}"])


def test_tool_call_fraction_is_refused_outside_the_calculator_task() -> None:
    with pytest.raises(ConfigError, match="sft.tool_call_fraction"):
        load_config(None, ["sft.tool_call_fraction=0.5"])
    load_config(None, ["sft.tool_call_fraction=1.0"])  # the default is fine anywhere


def test_a_second_stage_is_validated_and_refused_outside_the_calculator_task() -> None:
    calculator = ["task.name=calculator", "rollout.workflow=agent", "sft.second_stage_steps=10"]
    load_config(None, calculator)
    for bad in (
        "sft.second_stage_steps=-1",
        "sft.second_stage_lr=0",
        "sft.second_stage_warmup_steps=-1",
        "sft.second_stage_tool_call_fraction=1.5",
    ):
        with pytest.raises(ConfigError, match=bad.split("=")[0]):
            load_config(None, [*calculator, bad])
    with pytest.raises(ConfigError, match="sft.second_stage_steps"):
        load_config(None, ["sft.second_stage_steps=10"])
    with pytest.raises(ConfigError, match="sft.second_stage_lr set without sft.second_stage_steps"):
        load_config(None, ["task.name=calculator", "rollout.workflow=agent", "sft.second_stage_lr=2e-3"])
    load_config(None, ["sft.second_stage_steps=0"])  # the default is fine anywhere


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


def test_problem_kind_is_the_operation_and_the_digits_of_each_operand() -> None:
    assert problem_kind("483*57") == "mul 3x2"
    assert problem_kind("294+448*496") == "add_mul 3+3x3"
    assert problem_kind("38521-4417") == "sub 5-4"
    for bad in ("12+7-5", "48213*379*2", "", "1/2"):
        with pytest.raises(ValueError, match="not a calculator question"):
            problem_kind(bad)


@pytest.mark.parametrize(("cap", "kinds"), [(3, 5), (0, 26)])
def test_every_problem_has_a_kind_and_the_cap_sets_how_many(cap: int, kinds: int) -> None:
    """Cap 3: every operand has 3 digits but a product's second (2 or 3), so five kinds; the built-in
    ranges give 3 x 3 products, 2 x 2 x 2 additions of a product and 3 x 3 subtractions."""
    train, held = make_calculator_splits(1234, 3000, 256, max_digits=cap)
    found = {problem_kind(p.question) for p in train + held}
    assert len(found) == kinds
    if cap == 3:
        assert found == {"mul 3x2", "mul 3x3", "add_mul 3+3x2", "add_mul 3+3x3", "sub 3-3"}


def test_calculator_prompts_carry_their_kind(tiny_policy_dir) -> None:
    from asyncrl.data.prompts import build_task
    from asyncrl.models import load_tokenizer

    cfg = load_config(None, ["task.name=calculator", "task.train_size=8", "task.eval_size=8"])
    train, held, _ = build_task(cfg.task, load_tokenizer(tiny_policy_dir))
    for prompt in train + held:
        assert prompt.meta[KIND_KEY] == problem_kind(prompt.meta["question"])
