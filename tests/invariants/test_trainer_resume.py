"""Exact resume: a run resumed from a checkpoint at step k reaches the same parameters at step
k + n as the uninterrupted run (synchronous, fixed seeds, CPU).

The policy has attention dropout, so the step consumes the torch RNG: the resume must restore
RNG states as well as weights, optimizer moments and the version (which drives the LR
schedule). The resumed trainer is built from the checkpoint's Hugging Face files
(``AutoModelForCausalLM.from_pretrained``), as a fresh process would. A control run that
perturbs the RNG after loading shows the test can fail.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from asyncrl.config import AlgoConfig, TrainerConfig
from asyncrl.models import load_tokenizer
from asyncrl.trainer.trainer import Trainer
from asyncrl.types import TrainBatch
from tests.trainer.synthetic import make_samples

K, N = 3, 3
CFG = TrainerConfig(
    lr=3e-3, warmup_steps=2, lr_schedule="cosine", decay_steps=8, max_tokens_per_micro_batch=96, ppo_minibatches=2
)
ALGO = AlgoConfig(behav_cap=None)


def _batch(step: int) -> TrainBatch:
    return TrainBatch(tuple(make_samples(10, seed=100 + step, version=step)), version=step)


def _model(path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager", attention_dropout=0.2)


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _run(trainer: Trainer, steps: range) -> list[float]:
    return [trainer.train_step(_batch(step)).metrics["loss"] for step in steps]


def test_resume_from_step_k_reaches_the_same_parameters(tiny_policy_dir, tmp_path) -> None:
    torch.set_num_threads(1)
    _seed(0)
    straight = Trainer(_model(tiny_policy_dir), CFG, ALGO)
    losses = _run(straight, range(K + N))
    expected = {k: v.clone() for k, v in straight.model.state_dict().items()}

    _seed(0)
    first = Trainer(_model(tiny_policy_dir), CFG, ALGO, tokenizer=load_tokenizer(tiny_policy_dir))
    assert _run(first, range(K)) == losses[:K]
    ckpt = tmp_path / "ckpt"
    first.save_checkpoint(ckpt, extra={"data_position": K, "ledger": [1, 2, 3]})
    # a plain HF checkpoint: nothing in it needs asyncrl's attention registered to load
    assert "asyncrl" not in (ckpt / "config.json").read_text()
    assert (ckpt / "tokenizer_config.json").is_file() and (ckpt / "trainer_state.pt").is_file()
    del first

    def resumed(perturb: bool) -> Trainer:
        _seed(12345)  # a fresh process: different RNG state until the checkpoint restores it
        trainer = Trainer(_model(ckpt), CFG, ALGO)
        extra = trainer.load_checkpoint(ckpt)
        assert extra == {"data_position": K, "ledger": [1, 2, 3]}
        assert trainer.version == K
        if perturb:
            torch.manual_seed(777)
        return trainer

    again = resumed(perturb=False)
    assert _run(again, range(K, K + N)) == losses[K:]
    for name, value in again.model.state_dict().items():
        assert torch.equal(value, expected[name]), name

    control = resumed(perturb=True)
    _run(control, range(K, K + N))
    assert any(not torch.equal(v, expected[k]) for k, v in control.model.state_dict().items())
