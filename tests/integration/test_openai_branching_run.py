"""A short ``asyncrl train`` through the OpenAI door with ``agent.episode_mode`` tree and individual: the agent
(``tests/rollout/branching_agents.py:branch``, the real ``openai`` client) makes one call, two concurrent
sub-calls from its reply, then continues one of them, so each episode yields two samples in tree mode (two
chains sharing the first completion: 2 and 3 calls) and four in individual mode (one per call), and each
group that many times ``rollout.group_size`` samples. On the tiny random-init
policy (learning is not asked of it): every step trains, the ledger passes its checks with groups of their
own size, and every trained sample is a chain of the engine's ids with the loss on its model tokens only."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.controller.ledger_checks import check_ledger
from asyncrl.controller.rundir import read_jsonl
from asyncrl.launch.local import train
from tests.repo_paths import REPO

pytest.importorskip("openai")

STEPS, GROUP, BATCH = 2, 2, 2


@pytest.mark.parametrize(("mode", "per_episode", "chains"), [("tree", 2, [2, 3]), ("individual", 4, [1, 1, 1, 1])])
def test_a_branching_agent_trains(
    mode: str, per_episode: int, chains: list[int], tiny_policy_dir: Path, tmp_path: Path, monkeypatch, trained_batches
) -> None:
    monkeypatch.syspath_prepend(str(REPO))  # tests.rollout.branching_agents, as a user's own module would be
    run_dir = tmp_path / "run"
    cfg = load_config(
        None,
        [
            f"model.path={tiny_policy_dir}",
            f"run.run_dir={run_dir}",
            "run.progress=false",
            "run.torch_threads=1",
            "rollout.workflow=openai_agent",
            "agent.entrypoint=tests.rollout.branching_agents:branch",
            f"agent.episode_mode={mode}",
            "agent.reward_discount=0.5",
            "agent.max_tokens=96",
            "agent.max_turn_tokens=8",
            "rollout.max_new_tokens=8",
            "eval.max_new_tokens=8",
            "task.eval_size=2",
            f"rollout.group_size={GROUP}",
            f"controller.batch_size={BATCH}",
            "controller.max_staleness=1",
            f"controller.total_steps={STEPS}",
            "controller.trainer_process=false",
            "algo.filter_equal_rewards=false",
        ],
    )
    _, summary = train(cfg)
    assert summary["steps"] == STEPS and summary["stop_reason"] is None
    report = check_ledger(run_dir, ended=True, total_steps=STEPS).require()
    assert report.trained == STEPS * BATCH * GROUP * per_episode
    trained = [r for r in read_jsonl(run_dir / "trajectories.jsonl") if r["status"] == "trained"]
    assert {r["group_samples"] for r in trained} == {GROUP * per_episode} and {r["episode"] for r in trained} == {0, 1}
    for pid in {r["prompt_id"] for r in trained}:  # per episode: its samples' calls
        for episode in (0, 1):
            turns = sorted(len(r["turns"]) for r in trained if r["prompt_id"] == pid and r["episode"] == episode)
            assert turns == chains, (pid, episode, turns)
    assert len(trained_batches) == STEPS
    for groups, samples in trained_batches:
        trajectories = [t for g in groups for t in g.trajectories]
        assert len(trajectories) == len(samples) == BATCH * GROUP * per_episode
        for g in groups:
            assert g.episodes == (0,) * per_episode + (1,) * per_episode and len(set(g.rewards)) > 1  # discounts
        for traj, sample in zip(trajectories, samples, strict=True):
            assert sample.token_ids == traj.token_ids  # the chain's ids, as the engine had them
            assert sample.loss_mask == (0,) * len(traj.prompt_ids) + traj.loss_mask
            assert sum(traj.loss_mask) == sum(len(s.token_ids) for s in traj.model_segments)
            model = [v for s in traj.model_segments for v in s.versions]
            assert [v for v, m in zip(sample.versions, sample.loss_mask, strict=True) if m] == model
