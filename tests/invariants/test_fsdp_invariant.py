"""DESIGN §4.6, sharding is invisible: FSDP2 over 2 ranks (gloo, CPU, ``torchrun`` inside the test)
gives the same parameters after training steps as 1 rank, within fp32 tolerance.

The 2-rank run uses the leader/follower protocol of ``asyncrl train`` (``run_distributed``):
rank 0's trainer leads, rank 1 mirrors every call. Besides the steps it exercises log-probs,
the full-state-dict gather, a checkpoint and a safetensors export; the 1-rank side checks them
(the 2-rank checkpoint resumes on 1 rank and keeps training identically).
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncrl.config import AlgoConfig, TrainerConfig
from asyncrl.trainer.checkpoint import read_hf_weights
from asyncrl.trainer.trainer import Trainer
from asyncrl.types import TrainBatch
from tests.trainer.synthetic import make_samples, rel_diff

WORKER = r"""
import pickle, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
from transformers import AutoModelForCausalLM
from asyncrl.trainer.distributed import run_distributed
from asyncrl.trainer.trainer import Trainer
from asyncrl.types import TrainBatch

policy_dir, spec_file, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
spec = pickle.loads(Path(spec_file).read_bytes())

def leader():
    model = AutoModelForCausalLM.from_pretrained(policy_dir, attn_implementation="eager")
    trainer = Trainer(model, spec["cfg"], spec["algo"])
    assert trainer.world_size == 2 and trainer.leader
    metrics = [trainer.train_step(TrainBatch(tuple(b), i)).metrics for i, b in enumerate(spec["batches"])]
    state = trainer.full_state_dict()
    logp = trainer.compute_logprobs(spec["batches"][0])
    trainer.save_checkpoint(out / "ckpt", extra={"data_position": 7})
    update = trainer.export_weights("safetensors")
    model.save_pretrained(out / "hf")  # the caller's (now sharded) object saves the full weights
    torch.save({"state": state, "metrics": metrics, "logp": logp, "export": update.path}, out / "result.pt")

run_distributed(leader, follower=Trainer.follower, backend="gloo", timeout_s=120)
"""

TOL = 1e-5


@pytest.mark.timeout(240)
def test_two_rank_fsdp_step_equals_one_rank(tiny_policy_dir, tmp_path) -> None:
    torch.set_num_threads(1)
    cfg = TrainerConfig(lr=1e-2, max_tokens_per_micro_batch=64, grad_clip=0.3, ppo_minibatches=2, balance="kk")
    algo = AlgoConfig(behav_cap=None)
    batches = [make_samples(13, seed=s, version=s) for s in range(2)]  # odd count: uneven shards
    spec_file = tmp_path / "spec.pkl"
    spec_file.write_bytes(pickle.dumps({"cfg": cfg, "algo": algo, "batches": batches}))
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [
            torchrun,
            "--standalone",
            "--nproc_per_node",
            "2",
            str(script),
            str(tiny_policy_dir),
            str(spec_file),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=200,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    res = torch.load(tmp_path / "result.pt", weights_only=False)

    one = Trainer(AutoModelForCausalLM.from_pretrained(str(tiny_policy_dir)), cfg, algo)
    metrics = [one.train_step(TrainBatch(tuple(b), i)).metrics for i, b in enumerate(batches)]
    for m1, m2 in zip(metrics, res["metrics"], strict=True):
        for key in ("loss", "grad_norm", "clip_frac", "behav_weight_mean", "trained_tokens"):
            assert m2[key] == pytest.approx(m1[key], rel=TOL, abs=1e-7), key
    assert max(m["grad_norm"] for m in metrics) > cfg.grad_clip  # clipping was active on both sides
    state = one.full_state_dict()
    assert set(res["state"]) == set(state)
    for name, value in state.items():
        assert rel_diff(res["state"][name], value) <= TOL, name
    for a, b in zip(one.compute_logprobs(batches[0]), res["logp"], strict=True):
        assert torch.allclose(a, b, atol=1e-5)

    # what rank 0 wrote: the safetensors export and the HF save hold the gathered weights
    for path in (Path(res["export"]), tmp_path / "hf"):
        exported = read_hf_weights(path)
        for name, value in exported.items():
            assert torch.equal(value, res["state"][name]), name
    # the 2-rank checkpoint resumes on 1 rank and trains on exactly like the 1-rank run
    resumed = Trainer(AutoModelForCausalLM.from_pretrained(str(tmp_path / "ckpt")), cfg, algo)
    assert resumed.load_checkpoint(tmp_path / "ckpt") == {"data_position": 7} and resumed.version == 2
    r1 = one.train_step(TrainBatch(tuple(batches[0]), 2))
    r2 = resumed.train_step(TrainBatch(tuple(batches[0]), 2))
    assert r2.metrics["loss"] == pytest.approx(r1.metrics["loss"], rel=TOL, abs=1e-7)
    after = resumed.full_state_dict()
    for name, value in one.full_state_dict().items():
        assert rel_diff(after[name], value) <= TOL, name
