"""DESIGN §4.5, packing is invisible: the packed trainer's loss and gradients equal one padded batch.

The reference is computed here, independently of the trainer: an eager-attention model on one
right-padded ``[B, T]`` batch, ``log_softmax`` log-probs, and ``policy_loss`` with its own local
denominator (which for one whole batch is the global one). The trainer runs the same samples
as several packed, padding-free micro-batches under a small token budget. Also: 1 micro-batch
x 4 accumulations equals 4 x 1, in loss, gradients and the parameters after real steps.
"""

from __future__ import annotations

import pytest
import torch

from asyncrl.algo.losses import policy_loss
from asyncrl.config import AlgoConfig, TrainerConfig
from asyncrl.models import load_policy
from asyncrl.trainer.trainer import Trainer
from asyncrl.types import TrainBatch
from tests.trainer.synthetic import make_samples, rel_diff

TOL = 1e-5


def _padded_reference(model, samples, algo: AlgoConfig, temperature: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
    width = max(len(s.token_ids) for s in samples)

    def rows(attr: str, fill: float = 0.0, dtype=torch.float32) -> torch.Tensor:
        out = torch.full((len(samples), width), fill, dtype=dtype)
        for b, s in enumerate(samples):
            out[b, : len(s.token_ids)] = torch.tensor(getattr(s, attr), dtype=dtype)
        return out

    ids = rows("token_ids", 0, torch.long)
    attn = torch.zeros_like(ids)
    for b, s in enumerate(samples):
        attn[b, : len(s.token_ids)] = 1
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, attention_mask=attn).logits.float() / temperature
    lp = torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    logp = torch.cat([torch.zeros(len(samples), 1), lp], dim=1)
    behav = rows("behav_logprobs")
    loss, _ = policy_loss(
        logp,
        logp.detach(),  # prox_mode="recompute": the weights at the start of the step
        behav,
        rows("advantages"),
        rows("loss_mask"),
        eps_clip=algo.eps_clip,
        behav_cap=algo.behav_cap,
        behav_cap_level=algo.behav_cap_level,
        aggregation=algo.aggregation,
        loss_type=algo.loss_type,
    )
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    "aggregation, loss_type, cap_level",
    [
        ("token_mean", "ppo", "token"),
        ("seq_mean_token_mean", "ppo", "sequence"),
        ("seq_mean_token_sum", "ppo", "token"),
        ("seq_mean_token_mean", "gspo", "token"),
    ],
)
def test_packed_micro_batches_equal_one_padded_batch(tiny_policy_dir, aggregation, loss_type, cap_level) -> None:
    algo = AlgoConfig(
        aggregation=aggregation,
        loss_type=loss_type,
        behav_cap=2.0,
        behav_cap_level=cap_level,
        eps_clip=0.2 if loss_type == "ppo" else 0.05,
    )
    model, _ = load_policy(tiny_policy_dir)
    trainer = Trainer(model, TrainerConfig(max_tokens_per_micro_batch=64), algo, temperature=0.8)
    samples = make_samples(24, seed=5, logprob_fn=trainer.compute_logprobs, noise=0.4)
    assert len(trainer._plan([len(s.token_ids) for s in samples])) >= 4  # really split
    loss = trainer.accumulate_gradients(samples)
    grads = [p.grad.detach().clone() for p in trainer.model.parameters()]

    ref_model, _ = load_policy(tiny_policy_dir)  # eager attention, untouched by the trainer
    ref_loss, ref_grads = _padded_reference(ref_model, samples, algo, temperature=0.8)
    assert abs(loss - float(ref_loss)) <= TOL * max(1.0, abs(float(ref_loss)))
    assert any(float(g.norm()) > 0 for g in ref_grads)
    for g, r in zip(grads, ref_grads, strict=True):
        assert rel_diff(g, r) <= TOL


@pytest.mark.parametrize("mode", ["padded", "padded_grouped"])
def test_trainer_padded_mode_equals_packed_mode(tiny_policy_dir, mode: str) -> None:
    """The padded baselines (fixed-size micro-batches, in batch order or grouped by length) train
    exactly the same objective."""
    model, _ = load_policy(tiny_policy_dir)
    packed = Trainer(model, TrainerConfig(max_tokens_per_micro_batch=48), AlgoConfig())
    samples = make_samples(10, seed=2, logprob_fn=packed.compute_logprobs)
    loss = packed.accumulate_gradients(samples)
    grads = [p.grad.detach().clone() for p in packed.model.parameters()]
    model2, _ = load_policy(tiny_policy_dir)
    padded = Trainer(model2, TrainerConfig(micro_batching=mode, padded_micro_batch_size=3), AlgoConfig())
    lengths = [len(s.token_ids) for s in samples]
    plan = padded._plan(lengths)
    assert sorted(i for b in plan for i in b) == list(range(len(samples)))
    if mode == "padded_grouped":  # buckets of neighbours in length, longest first
        assert [lengths[i] for b in plan for i in b] == sorted(lengths, reverse=True)
    loss2 = padded.accumulate_gradients(samples)
    assert abs(loss - loss2) <= TOL * max(1.0, abs(loss2))
    for g, p in zip(grads, padded.model.parameters(), strict=True):
        assert rel_diff(g, p.grad) <= TOL


def test_one_micro_batch_of_four_equals_four_of_one(tiny_policy_dir) -> None:
    lengths = [7, 12, 5, 9]
    trainers = []
    for budget in (10_000, 1):  # one micro-batch holding all 4 / four micro-batches of 1 (accumulated)
        model, _ = load_policy(tiny_policy_dir)
        trainers.append(Trainer(model, TrainerConfig(lr=1e-2, max_tokens_per_micro_batch=budget), AlgoConfig()))
    one, four = trainers
    samples = make_samples(4, seed=9, lengths=lengths, logprob_fn=one.compute_logprobs)
    assert [len(b) for b in one._plan([len(s.token_ids) for s in samples])] == [4]
    assert [len(b) for b in four._plan([len(s.token_ids) for s in samples])] == [1, 1, 1, 1]
    loss1, loss4 = one.accumulate_gradients(samples), four.accumulate_gradients(samples)
    assert abs(loss1 - loss4) <= TOL * max(1.0, abs(loss1))
    for a, b in zip(one.model.parameters(), four.model.parameters(), strict=True):
        assert rel_diff(b.grad, a.grad) <= TOL
    # and whole training steps (prox recompute, clip, AdamW) keep them together
    for step in range(3):
        r1 = one.train_step(TrainBatch(tuple(samples), step))
        r4 = four.train_step(TrainBatch(tuple(samples), step))
        assert r1.metrics["micro_batches"] == 1 and r4.metrics["micro_batches"] == 4
        assert r1.metrics["loss"] == pytest.approx(r4.metrics["loss"], rel=TOL, abs=TOL)
    for a, b in zip(one.model.parameters(), four.model.parameters(), strict=True):
        assert rel_diff(b.detach(), a.detach()) <= TOL
