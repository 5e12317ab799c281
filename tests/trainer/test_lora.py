"""LoRA through peft: only adapters train, engines get merged weights or the adapters alone, checkpoints
resume exactly."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncrl.config import AlgoConfig, TrainerConfig
from asyncrl.models import load_policy
from asyncrl.trainer.lora import adapter_layers, apply_lora
from asyncrl.trainer.trainer import Trainer
from asyncrl.types import TrainBatch, WeightUpdate
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


def test_the_adapters_alone_make_an_engine_serve_the_peft_models_weights(tiny_policy_dir) -> None:
    import asyncio

    from asyncrl.rollout.engine import LocalEngine, SamplingParams

    peft_model = apply_lora(load_policy(tiny_policy_dir)[0], CFG).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:  # B starts at zero: give the adapters an effect
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    layers = adapter_layers(peft_model)
    assert set(layers) == {
        f"model.layers.{i}.{m}"
        for i in range(len(peft_model.get_base_model().model.layers))
        for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")
    }
    a, b, scaling = layers["model.layers.0.self_attn.q_proj"]
    assert a.shape[0] == b.shape[1] == CFG.lora_rank and scaling == CFG.lora_alpha / CFG.lora_rank
    model, tokenizer = load_policy(tiny_policy_dir)
    engine = LocalEngine(model, tokenizer, max_slots=2, max_seq_len=64)
    try:
        prompt = [5, 9, 13, 2, 40, 7]

        async def go():
            await engine.update_weights(WeightUpdate(3, adapter=layers))
            return await engine.generate(prompt, SamplingParams(max_new_tokens=16, greedy=True))

        (out,) = asyncio.run(asyncio.wait_for(go(), timeout=60))
    finally:
        engine.close()
    assert out.versions == (3,) * 16
    ids = torch.tensor([prompt + list(out.output_ids)])
    with torch.no_grad():
        logp = torch.log_softmax(peft_model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float(), dim=-1)
    assert logp.argmax(-1).tolist() == list(out.output_ids)  # greedy under the peft model's weights
    want = logp.gather(1, torch.tensor(out.output_ids)[:, None])[:, 0]
    assert (want - torch.tensor(out.behav_logprobs)).abs().max().item() < 1e-4
