"""kl_penalty, entropy_from_logits and loglinear_prox_logp against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.algo import losses
from asyncrl.algo.logprobs import entropy_from_logits, kl_penalty, loglinear_prox_logp

F64 = torch.float64


def test_losses_module_reexports():
    assert losses.kl_penalty is kl_penalty
    assert losses.entropy_from_logits is entropy_from_logits
    assert losses.loglinear_prox_logp is loglinear_prox_logp


# ---------------------------------------------------------------- KL


def test_kl_penalty_hand_values():
    logp = torch.tensor([-1.0, -2.0, -0.5], dtype=F64)
    ref = torch.tensor([-1.5, -1.0, -0.5], dtype=F64)
    d = [0.5, -1.0, 0.0]
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), torch.tensor(d, dtype=F64))
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), torch.tensor([0.125, 0.5, 0.0], dtype=F64))
    k3 = [math.exp(-x) - (-x) - 1 for x in d]  # exp(ref - logp) - (ref - logp) - 1
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), torch.tensor(k3, dtype=F64), rtol=1e-14, atol=0)
    assert (kl_penalty(logp, ref, "k3") >= 0).all()


def test_kl_penalty_gradient_flows_into_logp_only():
    logp = torch.tensor([-1.0, -2.0], dtype=F64, requires_grad=True)
    ref = torch.tensor([-1.5, -1.0], dtype=F64, requires_grad=True)
    kl_penalty(logp, ref, "k3").sum().backward()
    # d/dlogp [exp(ref - logp) + logp - ref - 1] = 1 - exp(ref - logp)
    expected = torch.tensor([1 - math.exp(-0.5), 1 - math.exp(1.0)], dtype=F64)
    torch.testing.assert_close(logp.grad, expected)
    assert ref.grad is None
    assert torch.autograd.gradcheck(lambda x: kl_penalty(x, ref, "k2"), (logp.detach().clone().requires_grad_(),))


def test_kl_penalty_rejects_unknown_kind():
    with pytest.raises(ValueError, match="valid choices: k1, k2, k3"):
        kl_penalty(torch.zeros(2), torch.zeros(2), "k4")
    with pytest.raises(ValueError, match="shape"):
        kl_penalty(torch.zeros(2), torch.zeros(3), "k1")


# ---------------------------------------------------------------- entropy


def test_entropy_hand_values():
    logits = torch.tensor(
        [
            [0.0, 0.0, 0.0, 0.0],  # uniform over 4: log 4
            [0.0, -math.inf, -math.inf, 3.0],  # two tokens, p = (1, e^3) / (1 + e^3)
            [5.0, -math.inf, -math.inf, -math.inf],  # one-hot: 0
        ],
        dtype=F64,
    )
    p = 1 / (1 + math.exp(3.0))
    h2 = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor([math.log(4), h2, 0.0], dtype=F64))


def test_entropy_chunks_shapes_and_no_grad():
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(2, 5, 11, generator=g)).requires_grad_()
    full = entropy_from_logits(logits)
    assert full.shape == (2, 5) and full.dtype == torch.float32 and not full.requires_grad
    # row-wise, so equal up to a kernel that may vary with the chunk's shape
    torch.testing.assert_close(entropy_from_logits(logits, chunk_rows=3), full, rtol=1e-6, atol=1e-7)
    probs = torch.softmax(logits.detach().double(), -1)
    direct = -(probs * probs.log()).sum(-1)
    torch.testing.assert_close(full.double(), direct, rtol=1e-5, atol=1e-6)
    # a non-contiguous view (the usual logits[:, :-1]) gives the same values
    shifted = logits.detach()[:, :-1]
    assert not shifted.is_contiguous()
    torch.testing.assert_close(entropy_from_logits(shifted, chunk_rows=2), full[:, :-1], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(
        entropy_from_logits(logits.detach()[0, :, ::2]),
        entropy_from_logits(logits.detach()[0, :, ::2].contiguous()),
    )
    low = entropy_from_logits(logits.detach().to(torch.bfloat16))
    assert low.dtype == torch.float32 and torch.isfinite(low).all()


# ---------------------------------------------------------------- log-linear proximal approximation


def test_loglinear_alpha_follows_the_version_convention():
    # Training step i = 4: the proximal policy is version 4, current_version = v_θ = 5.
    # α = (v_θ - 1 - v) / (v_θ - v): v=4 -> 0 (prox = behav); v=3 -> 1/2; v=2 -> 2/3; v=0 -> 4/5
    behav = torch.tensor([[-1.0, -1.0, -2.0, -0.5, 0.0]], dtype=F64)
    logp = torch.tensor([[-0.5, -2.0, -1.0, -1.5, -math.inf]], dtype=F64, requires_grad=True)
    versions = torch.tensor([[4, 3, 2, 0, -1]])
    prox = loglinear_prox_logp(behav, logp, versions, current_version=5)
    expected = [
        -1.0,  # fresh: exactly behav
        -1.0 + 0.5 * (-2.0 + 1.0),
        -2.0 + (2 / 3) * (-1.0 + 2.0),
        -0.5 + 0.8 * (-1.5 + 0.5),
        0.0,  # version -1 (prompt/padding): behav unchanged, -inf logp ignored
    ]
    torch.testing.assert_close(prox, torch.tensor([expected], dtype=F64), rtol=1e-14, atol=0)
    assert not prox.requires_grad


def test_loglinear_loss_mask_and_nonfinite():
    behav = torch.tensor([[-1.0, 0.0, -2.0]], dtype=F64)
    logp = torch.tensor([[-3.0, math.nan, -1.0]], dtype=F64)
    versions = torch.tensor([[1, 7, 0]])  # the masked middle token carries a bogus version
    prox = loglinear_prox_logp(behav, logp, versions, current_version=3, loss_mask=torch.tensor([[1, 0, 1]]))
    expected = [-1.0 + 0.5 * (-3.0 + 1.0), 0.0, -2.0 + (2 / 3) * (-1.0 + 2.0)]
    torch.testing.assert_close(prox, torch.tensor([expected], dtype=F64), rtol=1e-14, atol=0)


def test_loglinear_rejects_tokens_newer_than_the_proximal_policy():
    behav = torch.zeros(1, 2)
    # passing the step index (4) instead of step + 1 (5) is caught: version 4 >= 4
    with pytest.raises(ValueError, match="current_version = training step \\+ 1"):
        loglinear_prox_logp(behav, behav, torch.tensor([[3, 4]]), current_version=4)
    with pytest.raises(ValueError, match="integer"):
        loglinear_prox_logp(behav, behav, torch.zeros(1, 2), current_version=4)
    with pytest.raises(ValueError, match="same shape"):
        loglinear_prox_logp(behav, behav, torch.zeros(1, 3, dtype=torch.long), current_version=4)
