"""The off-policy corrections reach the loss from the config: each ``algo`` key changes the step's
loss and metrics as it should (version-gap mask, M2PO, sequence-level caps, KL to the initial
weights, the uncorrected policy gradient), and M2PO's batch-level mask is invisible to packing."""

from __future__ import annotations

import math

import pytest

from asyncrl.config import AlgoConfig, TrainerConfig
from asyncrl.models import load_policy
from asyncrl.trainer.trainer import Trainer
from asyncrl.types import TrainBatch
from tests.trainer.synthetic import make_samples, rel_diff


def _trainer(policy_dir, version: int = 0, lr: float = 1e-4, tokens: int = 4096, **algo) -> Trainer:
    model, _ = load_policy(policy_dir)
    return Trainer(model, TrainerConfig(lr=lr, max_tokens_per_micro_batch=tokens), AlgoConfig(**algo), version=version)


def _stale(trainer: Trainer, n: int = 8, version: int = 0, noise: float = 0.3):
    return make_samples(n, seed=3, version=version, logprob_fn=trainer.compute_logprobs, noise=noise)


def _step(trainer: Trainer, samples) -> dict[str, float]:
    return trainer.train_step(TrainBatch(tuple(samples), trainer.version)).metrics


def test_version_gap_mask_drops_old_tokens(tiny_policy_dir) -> None:
    base = _trainer(tiny_policy_dir, version=6)
    samples = _stale(base, version=6)
    plain = _step(base, samples)
    gap = _step(_trainer(tiny_policy_dir, version=6, max_version_gap=2), samples)
    loss_tokens = [v for s in samples for v, m in zip(s.versions, s.loss_mask, strict=True) if m]
    want = sum(6 - v > 2 for v in loss_tokens) / len(loss_tokens)
    assert 0 < want < 1 and gap["version_gap_masked_frac"] == pytest.approx(want)
    assert gap["dropped_frac"] == pytest.approx(want) and "version_gap_masked_frac" not in plain
    assert gap["loss"] != pytest.approx(plain["loss"])


def test_m2po_mask_bounds_the_second_moment_and_is_invisible_to_packing(tiny_policy_dir) -> None:
    probe = _trainer(tiny_policy_dir)
    samples = _stale(probe)
    m2 = [_step(_trainer(tiny_policy_dir, tokens=tokens, m2_threshold=0.02), samples) for tokens in (4096, 48)]
    one, many = m2
    assert many["micro_batches"] > one["micro_batches"] == 1
    assert one["m2_before"] > 0.02 >= one["m2_after"] and 0 < one["m2_masked_frac"] < 1
    assert one["m2_before"] == pytest.approx(one["log_behav_weight_sq_mean"], rel=1e-4)
    # the mask is the whole mini-batch's: the same tokens go whatever the micro-batching
    assert many["m2_masked_frac"] == pytest.approx(one["m2_masked_frac"])
    assert many["loss"] == pytest.approx(one["loss"], rel=1e-5)
    plain = _step(_trainer(tiny_policy_dir), samples)
    assert plain["loss"] != pytest.approx(one["loss"]) and "m2_masked_frac" not in plain


@pytest.mark.parametrize("mode", ["mask", "clamp"])
def test_sequence_level_importance_sampling_is_reachable(tiny_policy_dir, mode: str) -> None:
    probe = _trainer(tiny_policy_dir)
    samples = _stale(probe, noise=0.6)
    kw = {"behav_cap": 1.1, "behav_cap_mode": mode}
    token = _step(_trainer(tiny_policy_dir, **kw), samples)
    seq = _step(_trainer(tiny_policy_dir, behav_cap_level="sequence", **kw), samples)
    assert token["behav_capped_frac"] != pytest.approx(seq["behav_capped_frac"])
    assert 0 < seq["behav_capped_frac"] < 1 and token["loss"] != pytest.approx(seq["loss"])


def test_kl_to_the_initial_weights(tiny_policy_dir) -> None:
    trainer = _trainer(tiny_policy_dir, lr=1e-2, kl_coef=0.5, kl_estimator="k3")
    samples = _stale(trainer)
    first = _step(trainer, samples)
    plain = _step(_trainer(tiny_policy_dir, lr=1e-2), samples)
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # still the initial weights
    assert first["loss"] == pytest.approx(plain["loss"], abs=1e-6)
    second = _step(trainer, samples)  # the weights moved: a positive KL adds to the loss
    assert second["kl_ref"] > 1e-4 and math.isfinite(second["loss"])
    assert "kl_ref" not in plain


def test_uncorrected_policy_gradient_equals_ppo_on_policy(tiny_policy_dir) -> None:
    grads = []
    for loss_type in ("ppo", "pg"):
        trainer = _trainer(tiny_policy_dir, loss_type=loss_type)
        trainer.accumulate_gradients(_stale(trainer, noise=0.0))  # behaviour = current: on-policy
        grads.append([p.grad.clone() for p in trainer.model.parameters()])
    for a, b in zip(*grads, strict=True):
        assert rel_diff(a, b) <= 1e-4


def test_step_reports_the_importance_ratio_statistics(tiny_policy_dir) -> None:
    trainer = _trainer(tiny_policy_dir)
    metrics = _step(trainer, _stale(trainer))
    for key in (
        "behav_weight_mean",
        "behav_weight_sq_mean",
        "log_behav_weight_sq_mean",
        "behav_capped_frac",
        "clip_frac",
        "dropped_frac",
    ):
        assert key in metrics and math.isfinite(metrics[key])
    assert metrics["behav_weight_sq_mean"] >= metrics["behav_weight_mean"] ** 2 - 1e-6
