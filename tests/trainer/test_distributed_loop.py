"""The whole asynchronous loop with a 2-rank FSDP2 trainer (gloo, CPU, ``torchrun`` inside the test).

Rank 0 runs ``asyncrl.launch.local.train`` (controller, engine, evaluation; the trainer in the
controller's thread, ``controller.trainer_process=false``) through ``run_distributed``; rank 1
follows its trainer. Checks the run completes with the loop's contract and that the final
checkpoint holds full (gathered, not sharded) weights. (The random-init policy earns no reward,
so its weights do not move here; the FSDP invariant test checks the training itself.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoModelForCausalLM

from asyncrl.controller.rundir import read_jsonl

DRIVER = r"""
import json, sys
from asyncrl.config import load_config
from asyncrl.launch.local import train
from asyncrl.trainer.distributed import run_distributed
from asyncrl.trainer.trainer import Trainer

cfg = load_config(None, sys.argv[1:])
out = run_distributed(lambda: train(cfg), follower=Trainer.follower, backend="gloo", timeout_s=300)
if out is not None:
    print("SUMMARY", json.dumps(out[1]))
"""


@pytest.mark.timeout(300)
def test_two_rank_training_run_completes(tiny_policy_dir, tmp_path) -> None:
    run_dir = tmp_path / "run"
    overrides = [
        f"model.path={tiny_policy_dir}",
        f"run.run_dir={run_dir}",
        "controller.max_staleness=1",
        "controller.total_steps=3",
        "controller.batch_size=4",
        "controller.max_concurrent=16",
        "rollout.group_size=4",
        "rollout.max_new_tokens=24",
        "rollout.max_slots=32",
        "eval.max_new_tokens=24",
        "task.eval_size=8",
        "task.train_size=500",
        "algo.filter_equal_rewards=false",
        "run.progress=false",
        "trainer.max_tokens_per_micro_batch=256",
        "controller.trainer_process=false",
    ]
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", str(script), *overrides],
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    summary = json.loads(proc.stdout.split("SUMMARY", 1)[1].strip().splitlines()[0])
    assert summary["steps"] == 3 and summary["max_staleness_seen"] <= 1 and summary["trained_tokens_per_s"] > 0
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["version"] for m in metrics] == [1, 2, 3]
    assert all(m["applied"] for m in metrics)
    # the final checkpoint (trainer.save_pretrained on the leader) holds the full, gathered weights
    model = AutoModelForCausalLM.from_pretrained(str(run_dir / "checkpoint"))
    base = AutoModelForCausalLM.from_pretrained(str(tiny_policy_dir))
    shapes = {n: tuple(p.shape) for n, p in model.state_dict().items()}
    assert shapes == {n: tuple(p.shape) for n, p in base.state_dict().items()}


def _spawned_rank(rank: int, port: int, policy_dir: str, out: dict) -> None:
    import torch

    from asyncrl.config import AlgoConfig, TrainerConfig
    from asyncrl.models import load_policy
    from asyncrl.trainer.distributed import run_distributed
    from asyncrl.trainer.trainer import Trainer
    from asyncrl.types import TrainBatch
    from tests.trainer.synthetic import make_samples

    torch.set_num_threads(1)

    def leader() -> float:
        trainer = Trainer(load_policy(policy_dir)[0], TrainerConfig(lr=1e-2), AlgoConfig())
        result = trainer.train_step(TrainBatch(tuple(make_samples(5, seed=3)), 0))
        out["state"] = {k: v.clone() for k, v in trainer.full_state_dict().items()}
        return result.metrics["loss"]

    loss = run_distributed(
        leader,
        follower=Trainer.follower,
        backend="gloo",
        timeout_s=120,
        rank=rank,
        world_size=2,
        init_method=f"tcp://127.0.0.1:{port}",
    )
    out[f"rank{rank}"] = loss


def _run_two_ranks(target: Any, policy_dir: Any) -> dict:
    """Run ``target(rank, port, policy_dir, out)`` in two spawned processes; returns ``out``."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=target, args=(r, port, str(policy_dir), out)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(150)
        assert [p.exitcode for p in procs] == [0, 0]
        return dict(out)


@pytest.mark.timeout(180)
def test_ranks_started_without_torchrun(tiny_policy_dir) -> None:
    """Trainer ranks as child processes (explicit rank / world size / init method) train like one."""

    from asyncrl.config import AlgoConfig, TrainerConfig
    from asyncrl.models import load_policy
    from asyncrl.trainer.trainer import Trainer
    from asyncrl.types import TrainBatch
    from tests.trainer.synthetic import make_samples, rel_diff

    result = _run_two_ranks(_spawned_rank, tiny_policy_dir)
    assert result["rank1"] is None and isinstance(result["rank0"], float)
    one = Trainer(load_policy(tiny_policy_dir)[0], TrainerConfig(lr=1e-2), AlgoConfig())
    expect = one.train_step(TrainBatch(tuple(make_samples(5, seed=3)), 0))
    assert result["rank0"] == pytest.approx(expect.metrics["loss"], rel=1e-5, abs=1e-7)
    for name, value in one.full_state_dict().items():
        assert rel_diff(result["state"][name], value) <= 1e-5


def _spmd_rank(rank: int, port: int, policy_dir: str, out: dict) -> None:
    import torch

    from asyncrl.config import AlgoConfig, TrainerConfig
    from asyncrl.models import load_policy
    from asyncrl.trainer.distributed import init_distributed, sharded_state_dict, shutdown_distributed
    from asyncrl.trainer.trainer import Trainer
    from asyncrl.types import TrainBatch
    from tests.trainer.synthetic import make_samples

    torch.set_num_threads(1)
    ctx = init_distributed("gloo", 120, rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}")
    trainer = Trainer(load_policy(policy_dir)[0], TrainerConfig(lr=1e-2), AlgoConfig())  # SPMD: every rank builds
    assert not trainer.leader and trainer.world_size == 2
    trainer.train_step(TrainBatch(tuple(make_samples(5, seed=3)), 0))
    sharded = sharded_state_dict(trainer.model)
    shards = {k: (v.to_local().clone(), [p.is_shard(0) for p in v.placements]) for k, v in sharded.items()}
    every = ctx.all_gather_object(shards)
    full = trainer.full_state_dict()
    if rank == 0:
        out["full"] = {k: v.clone() for k, v in full.items()}
        out["shards"] = every
    shutdown_distributed()


@pytest.mark.timeout(180)
def test_spmd_ranks_full_and_sharded_state_dicts_agree(tiny_policy_dir) -> None:

    import torch

    result = _run_two_ranks(_spmd_rank, tiny_policy_dir)
    full, shards = result["full"], result["shards"]
    assert set(shards[0]) == set(full)
    for name, (piece, placements) in shards[0].items():
        assert placements == [True]  # one mesh dimension, sharded along dim 0
        whole = torch.cat([piece, shards[1][name][0]])  # dim-0 shards of rank 0 then rank 1
        assert torch.equal(whole, full[name]), name
        assert piece.shape[0] >= shards[1][name][0].shape[0]
