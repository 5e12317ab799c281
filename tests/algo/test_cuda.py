"""CUDA parity: the algo functions give the CPU results on a GPU (skipped without one)."""

from __future__ import annotations

import pytest
import torch

from asyncrl.algo.advantages import gae_advantages, grpo_advantages, normalize_batch
from asyncrl.algo.logprobs import entropy_from_logits, loglinear_prox_logp
from asyncrl.algo.losses import policy_loss

from .test_losses import AGGS, LOSS_TYPES, make_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("aggregation", AGGS)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_policy_loss_cuda_matches_cpu(loss_type, aggregation):
    batch = make_batch(21)
    kw = {"loss_type": loss_type, "aggregation": aggregation, "behav_cap": 2.0, "behav_cap_level": "sequence"}
    results = []
    for device in ("cpu", "cuda"):
        b = {k: v.to(device) for k, v in batch.items()}
        logp = b["logp"].clone().requires_grad_()
        loss, metrics = policy_loss(logp, b["prox"], b["behav"], b["adv"], b["mask"], **kw)
        (grad,) = torch.autograd.grad(loss, logp)
        results.append((loss.cpu(), grad.cpu(), metrics))
    (l0, g0, m0), (l1, g1, m1) = results
    torch.testing.assert_close(l1, l0)
    torch.testing.assert_close(g1, g0)
    assert m1 == pytest.approx(m0)
    # packed row with cu_seqlens left on the CPU
    flat = {k: v.reshape(1, -1).cuda() for k, v in batch.items()}
    cu = torch.arange(0, 43, 7)
    den = 42.0 if aggregation == "seq_mean_token_sum" else None
    packed, _ = policy_loss(
        flat["logp"],
        flat["prox"],
        flat["behav"],
        flat["adv"],
        flat["mask"],
        cu_seqlens=cu,
        denominator=den,
        **kw,
    )
    torch.testing.assert_close(packed.cpu(), l0)


def test_other_functions_cuda_match_cpu():
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(4, 8, generator=g)
    torch.testing.assert_close(grpo_advantages(rewards.cuda()).cpu(), grpo_advantages(rewards))
    mask = (torch.rand(4, 8, generator=g) > 0.3).long()
    torch.testing.assert_close(normalize_batch(rewards.cuda(), mask.cuda()).cpu(), normalize_batch(rewards, mask))
    values = torch.randn(4, 8, generator=g)
    for x, y in zip(
        gae_advantages(rewards.cuda(), values.cuda(), mask.cuda(), 0.9, 0.8),
        gae_advantages(rewards, values, mask, 0.9, 0.8),
        strict=True,
    ):
        torch.testing.assert_close(x.cpu(), y)
    logits = torch.randn(3, 5, 50, generator=g)
    torch.testing.assert_close(entropy_from_logits(logits.cuda()).cpu(), entropy_from_logits(logits))
    versions = torch.randint(0, 5, (4, 8), generator=g)
    prox = loglinear_prox_logp(values.cuda(), rewards.cuda(), versions.cuda(), 5).cpu()
    torch.testing.assert_close(prox, loglinear_prox_logp(values, rewards, versions, 5))
