"""LoRA through peft: only adapters train, engines get merged weights, checkpoints resume exactly."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncrl.config import AlgoConfig, TrainerConfig
from asyncrl.models import load_policy
from asyncrl.trainer.trainer import Trainer
from asyncrl.types import TrainBatch
from tests.trainer.synthetic import make_samples

pytest.importorskip("peft")

CFG = TrainerConfig(lr=2e-2, lora_rank=4, lora_alpha=8.0, lora_target_modules="q_proj,v_proj,down_proj")


def _steps(trainer: Trainer, steps: range) -> None:
    for v in steps:
        trainer.train_step(TrainBatch(tuple(make_samples(6, seed=10 + v, version=v)), v))


def test_lora_trains_adapters_and_exports_merged_weights(tiny_policy_dir, tmp_path) -> None:
    model, tokenizer = load_policy(tiny_policy_dir)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Trainer(model, CFG, AlgoConfig(behav_cap=None), tokenizer=tokenizer)
    trained = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trained and all(".lora_" in n for n in trained)
    assert sum(len(g["params"]) for g in trainer.optimizer.param_groups) == len(trained)
    _steps(trainer, range(2))

    exported = trainer.export_weights().tensors
    assert set(exported) == set(base)  # plain HF names, no adapter tensors
    changed = {k for k in base if not torch.equal(exported[k], base[k])}
    assert changed and all(any(t in k for t in ("q_proj", "v_proj", "down_proj")) for k in changed)
    # the merged weights are the adapted model: same logits as the peft model itself
    ids = torch.tensor([[5, 9, 13, 2, 40, 7]])
    plain, _ = load_policy(tiny_policy_dir)
    plain.load_state_dict(exported)
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=ids).logits, trainer.model(input_ids=ids).logits, atol=1e-5)
    # ... and what a checkpoint's HF directory holds (the launcher's model.save_pretrained is routed too)
    model.save_pretrained(tmp_path / "hf")
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, plain(input_ids=ids).logits, atol=1e-6)


def test_lora_checkpoint_resumes_exactly(tiny_policy_dir, tmp_path) -> None:
    algo = AlgoConfig(behav_cap=None)
    straight = Trainer(load_policy(tiny_policy_dir)[0], CFG, algo)
    _steps(straight, range(4))
    expected = straight.full_state_dict()

    first = Trainer(load_policy(tiny_policy_dir)[0], CFG, algo)
    _steps(first, range(2))
    first.save_checkpoint(tmp_path / "ckpt", extra={"k": 2})
    assert (tmp_path / "ckpt" / "adapter" / "adapter_config.json").is_file()

    resumed = Trainer(load_policy(tiny_policy_dir)[0], CFG, algo)  # from the original base model
    assert resumed.load_checkpoint(tmp_path / "ckpt") == {"k": 2}
    _steps(resumed, range(2, 4))
    for name, value in resumed.full_state_dict().items():
        assert torch.equal(value, expected[name]), name

    wrong_base = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ckpt"))  # merged weights as the base
    with pytest.raises(ValueError, match="base weights differ"):
        Trainer(wrong_base, CFG, algo).load_checkpoint(tmp_path / "ckpt")
