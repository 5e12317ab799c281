"""An agent written only against the ``openai`` client (``examples/openai_agent/agent.py:solve``) trains
through the door (``rollout.workflow=openai_agent``) and improves.

The policy is the embedded default: the tiny model warm-started on the synthetic task by a flawed
teacher whose final answer slips in 60% of its demonstrations (``ensure_policy``: cached under
``sft.cache_dir``, built on first use as by ``asyncrl train``), so it answers in the task's format and
is right only part of the time. ``asyncrl train`` then runs the example agent through the in-process
engine's loopback door, with the agent's own reward (its check of ``#<answer>``). Held-out greedy
accuracy (the workflow's own episodes) must not fall over ``STEPS`` steps, and every trained sample must be its
session's ids with the loss on the engine's tokens only. The size of the gain is not this test's business: over
six runs of this setting on the 2-core box it ranged from +0.02 to +0.27 (the run is asynchronous, so its batches
depend on timing); the agent bench (``python -m benchmarks agent-learning``) measures gains over seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.controller.rundir import read_jsonl
from asyncrl.launch.local import train
from asyncrl.launch.warm_start import ensure_policy
from tests.repo_paths import REPO

pytest.importorskip("openai")

STEPS = 16


def _cfg(model_dir: Path, run_dir: Path):
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            f"run.run_dir={run_dir}",
            "run.progress=false",
            "run.torch_threads=1",
            "rollout.workflow=openai_agent",
            "agent.entrypoint=examples.openai_agent.agent:solve",
            "agent.max_tokens=200",
            "rollout.max_new_tokens=96",
            "eval.max_new_tokens=96",
            "task.eval_size=64",
            "rollout.group_size=8",
            "rollout.max_slots=64",
            "controller.batch_size=4",
            "controller.max_staleness=1",
            "controller.max_concurrent=8",
            f"controller.total_steps={STEPS}",
            "controller.trainer_process=false",
            "trainer.lr=3e-4",
            "eval.greedy=true",
            "eval.report_greedy=false",
        ],
    )


def test_an_openai_client_agent_trains_through_the_door(tmp_path, monkeypatch, trained_batches) -> None:
    monkeypatch.syspath_prepend(str(REPO))  # examples.openai_agent.agent, as a user's own module would be
    monkeypatch.chdir(REPO)  # sft.cache_dir is relative: the warm start asyncrl train itself uses and caches
    model_dir = ensure_policy(load_config(None, []))
    run_dir = tmp_path / "run"
    batches = trained_batches
    _, summary = train(_cfg(model_dir, run_dir))
    assert summary["steps"] == STEPS and summary["stop_reason"] is None
    before, after = summary["accuracy_before"], summary["accuracy_after"]
    print(json.dumps({"accuracy_before": before, "accuracy_after": after, "wall_s": summary["wall_s"]}))
    assert 0.05 < before < 0.8, before  # taught the format, wrong part of the time
    assert after >= before, (before, after)

    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert len(metrics) == STEPS
    trained = [r for r in read_jsonl(run_dir / "trajectories.jsonl") if r["status"] == "trained"]
    assert trained and all(r["turns"] for r in trained)
    for groups, samples in batches:
        trajectories = [t for g in groups for t in g.trajectories]
        assert len(trajectories) == len(samples)
        for traj, sample in zip(trajectories, samples, strict=True):
            assert sample.token_ids == traj.token_ids  # the session's ids, as the engine had them
            assert sample.loss_mask == (0,) * len(traj.prompt_ids) + traj.loss_mask
            assert sum(traj.loss_mask) == sum(len(s.token_ids) for s in traj.model_segments)
