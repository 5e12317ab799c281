"""A short ``asyncrl train`` on a reasoning-gym task (``task.name=reasoning_gym``, scored by the dataset's own
``score_answer`` in the reward service) end to end on the tiny policy: it trains its steps and its ledger
passes the checks (every admitted prompt has one fate, the staleness bound held). Learning is not asked of
it (a random-init policy); ``docs/agent.md`` "Environments" records a run from the warm start."""

from __future__ import annotations

from pathlib import Path

from asyncrl.config import load_config
from asyncrl.controller.ledger_checks import check_ledger
from asyncrl.launch.local import train

STEPS = 2


def test_reasoning_gym_task_trains_with_a_passing_ledger(tiny_policy_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = load_config(
        None,
        [
            f"model.path={tiny_policy_dir}",
            f"run.run_dir={run_dir}",
            "run.progress=false",
            "task.name=reasoning_gym",
            "task.datasets=basic_arithmetic,chain_sum",
            "task.verifier=reasoning_gym",
            "task.train_size=64",
            "task.eval_size=8",
            "rollout.group_size=2",
            "rollout.max_new_tokens=16",
            "eval.max_new_tokens=16",
            "controller.batch_size=2",
            f"controller.total_steps={STEPS}",
            "controller.trainer_process=false",
            "reward.num_workers=1",
            "algo.filter_equal_rewards=false",
        ],
    )
    _, summary = train(cfg)
    assert summary["steps"] == STEPS and summary["reward_failures"] == 0
    report = check_ledger(run_dir, ended=True, total_steps=STEPS)
    assert report.ok and report.trained == STEPS * 2 * 2
