"""A short ``asyncrl train`` on a verifiers taskset (``task.name=verifiers`` played by ``agent.env=verifiers``,
each episode scored by the verifiers task's own ``@vf.reward`` functions) end to end on the tiny policy: it
trains its steps and its ledger passes the checks (every admitted prompt has one fate, the staleness bound
held). The taskset is ``tests/rollout/vf_tasksets/vf_sums.py``, written with verifiers 0.4.0's classes.
Learning is not asked of it (a random-init policy)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1")

from asyncrl.config import load_config  # noqa: E402
from asyncrl.controller.ledger_checks import check_ledger  # noqa: E402
from asyncrl.launch.local import train  # noqa: E402

STEPS = 2
TASKSETS = Path(__file__).resolve().parents[1] / "rollout" / "vf_tasksets"


def test_verifiers_taskset_trains_with_a_passing_ledger(tiny_policy_dir: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(TASKSETS))
    run_dir = tmp_path / "run"
    cfg = load_config(
        None,
        [
            f"model.path={tiny_policy_dir}",
            f"run.run_dir={run_dir}",
            "run.progress=false",
            "task.name=verifiers",
            "task.datasets=vf_sums",
            "task.train_size=32",
            "task.eval_size=4",
            "rollout.workflow=agent",
            "agent.env=verifiers",
            "agent.max_turns=2",
            "agent.max_tokens=48",
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
    assert report.open_prompts == 0
