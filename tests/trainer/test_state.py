"""Weight export (tensors, safetensors dir, bucketed broadcast), HF saving and checkpoint files."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.config import AlgoConfig, TrainerConfig
from asyncrl.models import load_policy
from asyncrl.rollout.engine import load_update_tensors
from asyncrl.trainer.checkpoint import MANIFEST, read_trainer_state, verify_manifest
from asyncrl.trainer.trainer import Trainer
from asyncrl.trainer.weights import broadcast_state_dict, receive_state_dict
from asyncrl.types import TrainBatch
from tests.trainer.synthetic import make_samples


def _trained(tiny_policy_dir, **cfg) -> Trainer:
    model, tokenizer = load_policy(tiny_policy_dir)
    trainer = Trainer(model, TrainerConfig(lr=1e-2, **cfg), AlgoConfig(), tokenizer=tokenizer)
    trainer.train_step(TrainBatch(tuple(make_samples(6, seed=1)), 0))
    return trainer


def test_safetensors_export_is_what_engines_load(tiny_policy_dir, tmp_path) -> None:
    trainer = _trained(tiny_policy_dir, weight_transport="safetensors", weight_export_dir=str(tmp_path / "w"))
    update = trainer.export_weights()
    assert update.version == 1 and update.tensors is None
    loaded = load_update_tensors(update)
    state = trainer.model.state_dict()
    for name, value in loaded.items():
        assert torch.equal(value, state[name])
    assert set(state) - set(loaded) == {"lm_head.weight"}  # tied copy dropped, as HF saves it
    assert trainer.last_export["transport"] == "safetensors" and trainer.last_export["export_bytes"] > 0
    for v in range(2, 5):  # older exports are pruned (the newest two stay)
        trainer.train_step(TrainBatch(tuple(make_samples(4, seed=v)), trainer.version))
        trainer.export_weights()
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["v00000003", "v00000004"]
    tensors = trainer.export_weights("tensors")
    assert tensors.version == 4 and torch.equal(tensors.tensors["lm_head.weight"], state["lm_head.weight"])


def test_save_pretrained_loads_with_transformers(tiny_policy_dir, tmp_path) -> None:
    trainer = _trained(tiny_policy_dir)
    trainer.model.save_pretrained(tmp_path / "hf")  # the trainer's model object saves normally
    trainer.save_pretrained(tmp_path / "hf2")
    ids = torch.tensor([[5, 9, 13, 2, 40]])
    with torch.no_grad():
        expect = trainer.model(input_ids=ids).logits
        for d in ("hf", "hf2"):
            model = AutoModelForCausalLM.from_pretrained(str(tmp_path / d))
            assert torch.allclose(model(input_ids=ids).logits, expect, atol=1e-5)
    assert AutoTokenizer.from_pretrained(str(tmp_path / "hf2")).eos_token == "<eos>"


def test_checkpoint_is_atomic_and_complete(tiny_policy_dir, tmp_path) -> None:
    trainer = _trained(tiny_policy_dir)
    ckpt = tmp_path / "ckpt"
    trainer.save_checkpoint(ckpt, extra={"step": 1})
    first = (ckpt / "model.safetensors").read_bytes()
    trainer.train_step(TrainBatch(tuple(make_samples(6, seed=2)), 1))
    trainer.save_checkpoint(ckpt, extra={"step": 2})  # replaces the previous one in place
    assert (ckpt / "model.safetensors").read_bytes() != first
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temporary or old directories left
    assert verify_manifest(ckpt) == [] and (ckpt / MANIFEST).is_file()  # every file listed with its hash
    state = read_trainer_state(ckpt)
    assert state["version"] == 2 and state["extra"] == {"step": 2} and len(state["rng"]) == 1
    assert set(state["optimizer"]["state"]) == {n for n, _ in trainer.model.named_parameters()}
    with pytest.raises(FileNotFoundError, match="not a trainer checkpoint"):
        trainer.load_checkpoint(tmp_path / "nothing")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _broadcast_rank(rank: int, port: int, state: dict, out: dict) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        if rank == 0:
            out["metrics"] = broadcast_state_dict(state, src=0, bucket_bytes=4096)
        else:
            out["received"] = receive_state_dict(src=0)
    finally:
        dist.destroy_process_group()


def test_bucketed_broadcast_round_trip(tiny_policy_dir) -> None:
    trainer = _trained(tiny_policy_dir)
    state = trainer.full_state_dict()
    state["scalar"] = torch.tensor(3.5)
    state["half"] = torch.arange(7, dtype=torch.bfloat16)
    port = _free_port()
    with mp.Manager() as manager:
        out = manager.dict()
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_broadcast_rank, args=(r, port, state, out)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert all(p.exitcode == 0 for p in procs)
        received, metrics = out["received"], out["metrics"]
    assert set(received) == set(state)
    for name, value in state.items():
        assert received[name].dtype == value.dtype and torch.equal(received[name], value), name
    assert metrics["broadcast_buckets"] > 10  # 4 KiB buckets: many, not one per parameter
    assert metrics["broadcast_bytes"] == sum(t.numel() * t.element_size() for t in state.values())


def test_safetensors_exports_prune_only_this_trainers_own(tmp_path, tiny_policy_dir) -> None:
    """Another run's exports in the same directory (even with higher versions) are left alone and
    never make this trainer delete the version it just wrote; its own beyond the newest 2 go."""
    model, tok = load_policy(tiny_policy_dir)
    root = tmp_path / "exports"
    (root / "v00000009").mkdir(parents=True)  # left by an earlier run
    trainer = Trainer(model, TrainerConfig(weight_export_dir=str(root)), AlgoConfig(), tokenizer=tok)
    paths = []
    for version in range(3):
        trainer.version = version
        update = trainer.export_weights("safetensors")
        assert (tmp_path / update.path / "model.safetensors").is_file()  # an absolute path
        paths.append(tmp_path / update.path)
    assert not paths[0].exists() and paths[1].exists() and paths[2].exists()
    assert (root / "v00000009").is_dir()
