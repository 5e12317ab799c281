"""The warm start of ``task.name=reasoning_gym`` (reasoning-gym 0.1.25's own generators): demonstrations of the
training entries only (never a held-out one), single-turn (question -> the answer worked out) or, with the calculator
tool, worked conversations whose call computes the entry's answer; a cache key that follows the held-out split."""

from __future__ import annotations

from asyncrl.config import load_config
from asyncrl.data.prompts import build_task
from asyncrl.data.reasoning_gym import ENTRY_KEY, calculator_expression, worked_solution
from asyncrl.launch.warm_start import warm_start_examples, warm_start_key
from asyncrl.models import load_policy
from asyncrl.reward.reasoning_gym import reasoning_gym_reward
from asyncrl.rollout.envs.calculator import evaluate_expression

RG = [
    "task.name=reasoning_gym",
    "task.verifier=reasoning_gym",
    "task.train_size=24",
    "task.eval_size=8",
    "task.datasets=chain_sum:max_terms=3:max_digits=2,leg_counting:min_animals=1:max_animals=2",
]
AGENT = [*RG, "rollout.workflow=agent", "agent.env=calculator", "agent.tool_format=tag"]


def _learned(tokenizer, ids, mask, on: int = 1) -> str:
    return tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m == on])


def test_single_turn_demonstrations_are_the_training_entries_worked_answers(tiny_policy_dir) -> None:
    _, tokenizer = load_policy(tiny_policy_dir, device="cpu", dtype="float32")
    cfg = load_config(None, RG)
    train, held, _ = build_task(cfg.task, tokenizer)
    examples = warm_start_examples(cfg, tokenizer)
    assert len(examples) == len(train) >= 20
    for (ids, mask), prompt in zip(examples, train, strict=True):
        assert tuple(ids[: len(prompt.token_ids)]) == prompt.token_ids  # the run's own prompt
        learned = _learned(tokenizer, ids, mask)
        assert learned == f"{worked_solution(prompt.meta[ENTRY_KEY])}{tokenizer.eos_token}"
        assert reasoning_gym_reward(learned.removesuffix(tokenizer.eos_token), prompt.meta) == 1.0  # its own scoring
    held_questions = {p.meta["question"] for p in held}
    assert not held_questions & {p.meta["question"] for p in train}


def test_calculator_conversations_call_an_expression_worth_the_answer(tiny_policy_dir) -> None:
    _, tokenizer = load_policy(tiny_policy_dir, device="cpu", dtype="float32")
    cfg = load_config(None, AGENT)
    train, held, _ = build_task(cfg.task, tokenizer)
    examples = warm_start_examples(cfg, tokenizer)
    eos, kinds = tokenizer.eos_token, set()
    for (ids, mask), prompt in zip(examples, train, strict=True):
        entry = prompt.meta[ENTRY_KEY]
        expression = calculator_expression(entry)
        assert evaluate_expression(expression) == prompt.answer == entry["answer"]  # from the generator's metadata
        assert _learned(tokenizer, ids, mask) == f"<calc>{expression}</calc>{eos}#{prompt.answer}{eos}"
        context = _learned(tokenizer, ids, mask, on=0)
        lines = [line for line in prompt.meta["question"].splitlines() if line]  # the tiny vocabulary has no newline
        assert all(line in context for line in lines) and prompt.answer in context  # the question, the tool's result
        kinds.add(entry["metadata"]["source_dataset"])
    assert kinds == {"chain_sum", "leg_counting"}
    assert not {p.meta["question"] for p in held} & {p.meta["question"] for p in train}


def test_the_key_follows_the_held_out_split_and_the_workflow() -> None:
    """Training is what follows the held-out entries, so eval_size enters the key here (it does not for the
    project's own tasks, whose split does not move)."""
    keys = {warm_start_key(load_config(None, [*RG, f"task.eval_size={n}"])) for n in (8, 16)}
    assert len(keys) == 2
    assert warm_start_key(load_config(None, AGENT)) != warm_start_key(load_config(None, RG))
    assert warm_start_key(load_config(None, AGENT)) == warm_start_key(load_config(None, AGENT))
