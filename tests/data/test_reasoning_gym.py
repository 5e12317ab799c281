"""reasoning-gym as a task (``task.name=reasoning_gym``) and its verifier (``task.verifier=reasoning_gym``), on
real dataset objects of the installed package: prompts from ``reasoning_gym.create_dataset``, held-out
disjoint from training, one dataset or several; rewards from the dataset's own ``score_answer``, in a reward
worker of the ``RewardService``; bad names and missing settings refused in one line. Ran against
reasoning-gym 0.1.25 (asserted below)."""

from __future__ import annotations

import asyncio
from importlib.metadata import version

import pytest
import reasoning_gym

from asyncrl.config import ConfigError, TaskConfig, load_config
from asyncrl.controller.scoring import make_score_fn
from asyncrl.data.prompts import build_task
from asyncrl.data.reasoning_gym import (
    ENTRY_KEY,
    calculator_expression,
    dataset_names,
    dataset_specs,
    load_entries,
    reasoning_gym_prompts,
    worked_solution,
)
from asyncrl.reward import reasoning_gym as reward_rg
from asyncrl.reward.reasoning_gym import reasoning_gym_reward, response_answer
from asyncrl.reward.service import RewardService
from asyncrl.types import KIND_KEY, Completion
from tests.rollout.chat_templates import tiny_tokenizer

REASONING_GYM = "0.1.25"


def render(question: str) -> tuple[int, ...]:
    return tuple(ord(c) % 97 for c in question)


def test_prompts_are_the_datasets_entries_with_a_disjoint_held_out_split() -> None:
    assert version("reasoning-gym") == REASONING_GYM
    assert reward_rg.ENTRY_KEY == ENTRY_KEY  # the reward side's copy of the key
    dataset = reasoning_gym.create_dataset("basic_arithmetic", seed=7, size=40)
    train, held = reasoning_gym_prompts("basic_arithmetic", 7, 30, 10, render)
    assert len(held) == 10 and 25 <= len(train) <= 30
    assert [p.meta[ENTRY_KEY] for p in held] == [dataset[i] for i in range(10)]  # the package's own entries
    assert not {p.meta["question"] for p in held} & {p.meta["question"] for p in train}
    first = held[0]
    assert first.answer == dataset[0]["answer"] and first.token_ids == render(dataset[0]["question"])
    assert first.meta[KIND_KEY] == "basic_arithmetic" and first.prompt_id == "rg-eval-0"
    assert len({p.prompt_id for p in train + held}) == len(train) + len(held)
    # two datasets through reasoning-gym's composite: both kinds appear, each scored by its own dataset
    train2, held2 = reasoning_gym_prompts("chain_sum, basic_arithmetic", 1, 40, 20, render)
    assert {p.meta[KIND_KEY] for p in train2 + held2} == {"chain_sum", "basic_arithmetic"}
    for p in held2:
        assert reasoning_gym_reward(f"<answer>{p.answer}</answer>", dict(p.meta)) == 1.0


@pytest.mark.parametrize("name", ["basic_arithmetic", "letter_counting", "countdown", "word_sorting"])
def test_the_datasets_own_score_answer_is_the_reward(name: str) -> None:
    dataset = reasoning_gym.create_dataset(name, seed=3, size=5)
    for entry in dataset:
        row = {ENTRY_KEY: entry}
        assert reasoning_gym_reward(f"thinking...\n<answer>{entry['answer']}</answer>", row) == 1.0
        assert reasoning_gym_reward(str(entry["answer"]), row) == dataset.score_answer(str(entry["answer"]), entry)
        wrong = reasoning_gym_reward("<answer>no idea</answer>", row)
        assert wrong == dataset.score_answer("no idea", entry) < 1.0


def test_answer_extraction_and_bad_rows() -> None:
    assert response_answer("a <answer>1</answer> b <answer> 42 </answer>") == "42"
    assert response_answer("  42\n") == "42"
    with pytest.raises(ValueError, match="needs the prompts of task.name=reasoning_gym"):
        reasoning_gym_reward("1", {"question": "?"})


def test_scored_in_the_reward_service(tmp_path) -> None:
    tok = tiny_tokenizer(tmp_path / "tok")
    task = TaskConfig(
        name="reasoning_gym", datasets="basic_arithmetic", seed=2, train_size=8, eval_size=4, verifier="reasoning_gym"
    )
    train, held, demos = build_task(task, tok)
    assert len(held) == 4 and train and demos == []

    async def go() -> list[tuple[float, str | None]]:
        async with RewardService(num_workers=1, timeout_s=30, preload=()) as service:
            score = make_score_fn("reasoning_gym", tok, service)
            out = []
            for p in held[:2]:
                for text in (f"<answer>{p.answer}</answer>", "<answer>999999999</answer>"):
                    ids = tuple(tok.encode(text, add_special_tokens=False))
                    out.append(await score(p, Completion(p.token_ids, ids, (0.0,) * len(ids), (0,) * len(ids), "stop")))
            return out

    assert asyncio.run(go()) == [(1.0, None), (0.0, None), (1.0, None), (0.0, None)]


def test_errors_a_user_can_type_are_one_line() -> None:
    cases = {
        ("task.name=reasoning_gym",): "needs task.datasets",
        ("task.name=reasoning_gym", "task.datasets=chain_sum"): "set task.verifier=reasoning_gym",
        ("task.verifier=reasoning_gym",): "task.verifier=reasoning_gym needs task.name=reasoning_gym",
    }
    for overrides, fragment in cases.items():
        with pytest.raises(ConfigError) as e:
            load_config(None, list(overrides))
        assert fragment in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError) as e:
        dataset_names("chain_sum,no_such_dataset")
    assert str(e.value).startswith("task.datasets='chain_sum,no_such_dataset': no_such_dataset is not a reasoning-gym")
    assert "basic_arithmetic" in str(e.value) and "\n" not in str(e.value)
    assert dataset_names(" chain_sum , gcd ") == ["chain_sum", "gcd"]


def test_a_datasets_own_config_options_follow_its_name() -> None:
    spec = "chain_sum:max_terms=2:max_digits=1, leg_counting:min_animals=1:max_animals=1:name=x"
    assert dataset_specs(spec) == [
        ("chain_sum", {"max_terms": 2, "max_digits": 1}),
        ("leg_counting", {"min_animals": 1, "max_animals": 1, "name": "x"}),
    ]
    assert dataset_names(spec) == ["chain_sum", "leg_counting"]
    entries = load_entries("chain_sum:min_terms=2:max_terms=2:max_digits=1", 3, 30)
    assert {e["metadata"]["num_terms"] for e in entries} == {2}
    assert all(len(n.strip()) == 1 for e in entries for n in e["metadata"]["expression"].replace("-", "+").split("+"))
    with pytest.raises(ValueError, match="not key=value"):
        dataset_specs("chain_sum:max_terms")
    with pytest.raises(ValueError, match="refused the options"):
        load_entries("leg_counting:max_animals=0", 3, 4)
    with pytest.raises(ValueError, match="not a reasoning-gym dataset"):
        dataset_specs("chain_sum:max_terms=2,nope:x=1")


def test_the_calculator_expression_of_an_entry_is_worth_its_answer() -> None:
    from asyncrl.rollout.envs.calculator import evaluate_expression

    entries = load_entries("chain_sum:max_terms=4,leg_counting:min_animals=1:max_animals=3,basic_arithmetic", 5, 60)
    kinds = {e["metadata"]["source_dataset"] for e in entries}
    assert kinds == {"chain_sum", "leg_counting", "basic_arithmetic"}
    for entry in entries:
        expression = calculator_expression(entry)
        assert expression is not None and " " not in expression
        if entry["metadata"]["source_dataset"] != "basic_arithmetic":  # its answers round divisions
            assert evaluate_expression(expression) == entry["answer"]
    legs = next(e for e in entries if e["metadata"]["source_dataset"] == "leg_counting")
    assert "*" in calculator_expression(legs)
    assert calculator_expression({"metadata": {"source_dataset": "gcd"}}) is None


def test_a_worked_solution_works_the_expression_out_and_scores_full_marks() -> None:
    entries = load_entries("chain_sum:max_terms=4:max_digits=2,leg_counting:min_animals=1:max_animals=3", 9, 40)
    for entry in entries:
        solution = worked_solution(entry)
        assert solution.endswith(f"<answer>{entry['answer']}</answer>")
        assert reasoning_gym_reward(solution, {ENTRY_KEY: entry}) == 1.0  # the dataset's own score_answer
        steps = solution.split(" ")[:-1]
        assert steps, solution  # every chain of two or more terms and every animal count is worked out
        for step in steps:
            left, right = step.split("=")
            assert eval(left.replace("--", "+")) == int(right)  # noqa: S307 (digits and + - * only)
    chain = {"answer": "9", "metadata": {"source_dataset": "chain_sum", "expression": "7 + 5 - 3"}}
    assert worked_solution(chain) == "7+5=12 12-3=9 <answer>9</answer>"
    legs = {"answer": "18", "metadata": {"source_dataset": "leg_counting", "animals": {"dog": 3, "bee": 1}}}
    assert worked_solution(legs) == "3*4=12 1*6=6 12+6=18 <answer>18</answer>"
    assert worked_solution({"answer": "4", "metadata": {"expression": "(1+3)"}}) == "<answer>4</answer>"
    assert worked_solution({"answer": "5", "metadata": {"expression": "1+3"}}) == "<answer>5</answer>"  # no lie
