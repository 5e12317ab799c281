"""The trainer step: versions advance, weights move, prox log-probs, non-finite steps skipped."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.config import AlgoConfig, TrainerConfig
from asyncrl.models import load_policy
from asyncrl.trainer.trainer import Trainer
from asyncrl.types import TrainBatch, TrainSample


def _samples(trainer: Trainer, n: int = 4, adv: float = 1.0) -> list[TrainSample]:
    torch.manual_seed(1)
    out = []
    for i in range(n):
        prompt = torch.randint(4, 90, (3 + i,)).tolist()
        resp = torch.randint(4, 90, (5 + 2 * i,)).tolist()
        ids = prompt + resp
        logp = trainer.compute_logprobs(
            [
                TrainSample(
                    "x", 0, tuple(ids), (0,) * len(ids), (0.0,) * len(ids), (0.0,) * len(ids), (-1,) * len(ids), 0, 0
                )
            ]
        )[0].tolist()
        mask = [0] * len(prompt) + [1] * len(resp)
        out.append(
            TrainSample(
                prompt_id=f"p{i}",
                sample_idx=0,
                token_ids=tuple(ids),
                loss_mask=tuple(mask),
                behav_logprobs=tuple(lp if m else 0.0 for lp, m in zip(logp, mask, strict=True)),
                advantages=tuple((adv if i % 2 == 0 else -adv) if m else 0.0 for m in mask),
                versions=tuple(0 if m else -1 for m in mask),
                min_version=0,
                max_version=0,
            )
        )
    return out


def test_step_advances_version_and_changes_weights(tiny_policy_dir) -> None:
    model, _ = load_policy(tiny_policy_dir)
    trainer = Trainer(model, TrainerConfig(lr=1e-2, max_tokens_per_micro_batch=16), AlgoConfig())
    before = [p.detach().clone() for p in model.parameters()]
    samples = _samples(trainer)
    result = trainer.train_step(TrainBatch(tuple(samples), version=0))
    assert result.applied and result.version == 1 and trainer.version == 1
    assert math.isfinite(result.metrics["loss"])
    # on-policy: behaviour == proximal, so the behaviour weight is 1 and nothing is clipped
    assert result.metrics["behav_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert result.metrics["clip_frac"] == 0.0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    update = trainer.export_weights()
    assert update.version == 1
    name, tensor = next(iter(update.tensors.items()))
    assert torch.equal(tensor, model.state_dict()[name]) and tensor.data_ptr() != model.state_dict()[name].data_ptr()


def test_wrong_version_and_empty_batch_are_errors(tiny_policy_dir) -> None:
    model, _ = load_policy(tiny_policy_dir)
    trainer = Trainer(model, TrainerConfig(), AlgoConfig())
    with pytest.raises(ValueError, match="version"):
        trainer.train_step(TrainBatch(tuple(_samples(trainer, 1)), version=3))
    with pytest.raises(ValueError, match="non-empty"):
        trainer.train_step(TrainBatch((), version=0))


def test_non_finite_step_is_skipped_not_applied(tiny_policy_dir) -> None:
    model, _ = load_policy(tiny_policy_dir)
    trainer = Trainer(model, TrainerConfig(), AlgoConfig(behav_cap=None))
    samples = _samples(trainer, 2, adv=float("nan"))
    before = [p.detach().clone() for p in model.parameters()]
    result = trainer.train_step(TrainBatch(tuple(samples), version=0))
    assert not result.applied and result.metrics["skipped"] == 1.0
    assert trainer.version == 1 and trainer.skipped_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize("prox_mode", ["recompute", "behav", "loglinear"])
def test_prox_modes_agree_on_policy(tiny_policy_dir, prox_mode: str) -> None:
    """On fresh on-policy data every proximal mode gives the same first-step loss."""
    model, _ = load_policy(tiny_policy_dir)
    trainer = Trainer(model, TrainerConfig(), AlgoConfig(prox_mode=prox_mode))
    result = trainer.train_step(TrainBatch(tuple(_samples(trainer)), version=0))
    ref_model, _ = load_policy(tiny_policy_dir)
    ref = Trainer(ref_model, TrainerConfig(), AlgoConfig(prox_mode="recompute"))
    ref_result = ref.train_step(TrainBatch(tuple(_samples(ref)), version=0))
    assert result.metrics["loss"] == pytest.approx(ref_result.metrics["loss"], abs=1e-5)


def test_lr_schedule_warmup_and_decay() -> None:
    from asyncrl.trainer.trainer import lr_factor

    cfg = TrainerConfig(warmup_steps=4, lr_schedule="cosine", decay_steps=14, min_lr_ratio=0.1)
    factors = [lr_factor(s, cfg, None) for s in range(16)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]
    assert factors[4] == pytest.approx(1.0) and factors[9] == pytest.approx(0.55)  # half-way: (1 + 0.1) / 2
    assert factors[14] == pytest.approx(0.1) and factors[15] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(factors[4:], factors[5:], strict=False))
    linear = TrainerConfig(warmup_steps=0, lr_schedule="linear")
    assert [lr_factor(s, linear, 5) for s in (0, 5)] == [1.0, 0.0]  # horizon from the run's total steps
    assert lr_factor(100, TrainerConfig(warmup_steps=2), None) == 1.0  # constant


def test_lr_follows_the_version_and_is_reported(tiny_policy_dir) -> None:
    model, _ = load_policy(tiny_policy_dir)
    cfg = TrainerConfig(lr=1e-2, warmup_steps=2, lr_schedule="linear", decay_steps=4)
    trainer = Trainer(model, cfg, AlgoConfig())
    lrs = [trainer.train_step(TrainBatch(tuple(_samples(trainer, 2)), v)).metrics["lr"] for v in range(4)]
    assert lrs == pytest.approx([5e-3, 1e-2, 1e-2, 5e-3])  # warm-up, peak, then linear to 0 at step 4


def test_first_token_cannot_carry_loss(tiny_policy_dir) -> None:
    model, _ = load_policy(tiny_policy_dir)
    trainer = Trainer(model, TrainerConfig(), AlgoConfig())
    s = _samples(trainer, 1)[0]
    bad = TrainSample(
        s.prompt_id, 0, s.token_ids, (1,) + s.loss_mask[1:], s.behav_logprobs, s.advantages, s.versions, 0, 0
    )
    with pytest.raises(ValueError, match="first token"):
        trainer.train_step(TrainBatch((bad,), 0))


@pytest.mark.parametrize(
    "overrides", [{"micro_batching": "padded", "padded_micro_batch_size": 3}, {"balance": "kk"}, {"precision": "bf16"}]
)
def test_step_modes_train(tiny_policy_dir, overrides) -> None:
    model, _ = load_policy(tiny_policy_dir)
    trainer = Trainer(model, TrainerConfig(lr=1e-2, max_tokens_per_micro_batch=24, **overrides), AlgoConfig())
    before = [p.detach().clone() for p in model.parameters()]
    result = trainer.train_step(TrainBatch(tuple(_samples(trainer, 5)), 0))
    assert result.applied and math.isfinite(result.metrics["loss"]) and result.metrics["micro_batches"] >= 2
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_ppo_minibatches_make_several_optimizer_updates(tiny_policy_dir) -> None:
    model, _ = load_policy(tiny_policy_dir)
    trainer = Trainer(model, TrainerConfig(ppo_minibatches=3), AlgoConfig())
    result = trainer.train_step(TrainBatch(tuple(_samples(trainer, 6)), 0))
    assert result.applied and trainer.version == 1
    state = trainer.optimizer.state[next(iter(trainer._params()))]
    assert int(state["step"]) == 3
    # the second and third updates see a moved policy: the ratio is no longer exactly 1
    assert result.metrics["approx_kl_prox"] > 0.0


def test_activation_checkpointing_gives_the_same_gradients(tiny_policy_dir) -> None:
    from tests.trainer.synthetic import make_samples, rel_diff

    grads = []
    for checkpointing in (False, True):
        model, _ = load_policy(tiny_policy_dir)
        cfg = TrainerConfig(max_tokens_per_micro_batch=40, activation_checkpointing=checkpointing)
        trainer = Trainer(model, cfg, AlgoConfig())
        flag = getattr(trainer.model, "is_activation_checkpointing", None)
        assert (flag if flag is not None else trainer.model.is_gradient_checkpointing) == checkpointing
        trainer.accumulate_gradients(make_samples(6, seed=4))
        grads.append([p.grad.clone() for p in trainer.model.parameters()])
    for a, b in zip(*grads, strict=True):
        assert rel_diff(b, a) <= 1e-6
