"""The off-policy corrections (``algo.corrections`` and ``policy_loss``'s ``drop`` / ``loss_type="pg"``)
against the plain-loop float64 references in ``_reference.py``, plus hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.algo.corrections import m2_keep, version_gap_keep
from asyncrl.algo.losses import policy_loss

from . import _reference as ref
from .test_losses import AGGS, CAP_IDS, CAPS, MASK, as_lists, make_batch

F64 = torch.float64


def _versions(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    v = torch.randint(0, 9, tuple(torch.tensor(MASK).shape), generator=g)
    return torch.where(torch.tensor(MASK) != 0, v, -1)


# ---------------------------------------------------------------- version gap


@pytest.mark.parametrize("max_gap", [0, 2, 5, 8])
def test_version_gap_keep_matches_reference(max_gap: int) -> None:
    versions, mask = _versions(3), torch.tensor(MASK)
    keep = version_gap_keep(versions, 8, max_gap, mask)
    assert keep.tolist() == ref.version_gap_keep(versions.tolist(), 8, max_gap, MASK)
    # max_gap 8 at version 8 keeps every token; the prompt/padding positions are never dropped
    if max_gap == 8:
        assert bool(keep.all())
    assert bool(keep[torch.tensor(MASK) == 0].all())


def test_version_gap_hand_values_and_errors() -> None:
    versions = torch.tensor([[-1, 3, 2, 0, 5]])
    assert version_gap_keep(versions, 5, 2).tolist() == [[True, True, False, False, True]]
    assert version_gap_keep(versions, 5, 0).tolist() == [[True, False, False, False, True]]
    with pytest.raises(ValueError, match="integer"):
        version_gap_keep(versions.double(), 5, 1)
    with pytest.raises(ValueError, match="max_gap"):
        version_gap_keep(versions, 5, -1)


# ---------------------------------------------------------------- M2PO


@pytest.mark.parametrize("tau", [0.0, 0.01, 0.04, 0.2, 10.0])
def test_m2_keep_matches_the_literal_loop(tau: float) -> None:
    batch = make_batch(2)
    log_w = batch["prox"] - batch["behav"]
    log_w[3, 0] = float("nan")  # not a loss token: ignored
    log_w[2, 0] = float("nan")  # row 2 has no loss token
    keep, stats = m2_keep(log_w, batch["mask"], tau)
    want, before, after, frac = ref.m2_keep(log_w.tolist(), MASK, tau)
    assert keep.tolist() == want
    assert stats["m2_before"] == pytest.approx(before, rel=1e-12)
    assert stats["m2_after"] == pytest.approx(after, rel=1e-12, abs=1e-15)
    assert stats["m2_masked_frac"] == pytest.approx(frac)
    assert stats["m2_after"] <= tau or frac == 1.0


def test_m2_keep_hand_values_ties_and_empty() -> None:
    # (log w)^2 = [0.01, 0.09, 0.25, 0.01]: mean 0.09. tau 0.05 -> drop 0.25 (mean 0.0367)
    log_w = torch.tensor([[0.1, -0.3, 0.5, 0.1]], dtype=F64)
    mask = torch.ones(1, 4)
    keep, s = m2_keep(log_w, mask, 0.05)
    assert keep.tolist() == [[True, True, False, True]]
    assert s["m2_before"] == pytest.approx(0.09) and s["m2_after"] == pytest.approx(0.11 / 3)
    assert s["m2_masked_frac"] == pytest.approx(0.25)
    keep, _ = m2_keep(log_w, mask, 0.0101)  # only the two 0.01 tokens fit
    assert keep.tolist() == [[True, False, False, True]]
    keep, s = m2_keep(log_w, mask, 0.2)  # already inside the region
    assert bool(keep.all()) and s["m2_masked_frac"] == 0.0
    tie = torch.tensor([0.3, 0.1, 0.3], dtype=F64)  # one of two equal values goes: the later one
    assert m2_keep(tie, torch.ones(3), 0.055)[0].tolist() == [True, True, False]
    keep, s = m2_keep(log_w, torch.zeros(1, 4), 0.0)
    assert bool(keep.all()) and s == {"m2_before": 0.0, "m2_after": 0.0, "m2_masked_frac": 0.0}
    with pytest.raises(ValueError, match="tau"):
        m2_keep(log_w, mask, -1.0)


# ---------------------------------------------------------------- policy_loss: drop and pg


@pytest.mark.parametrize("cap", CAPS, ids=CAP_IDS)
@pytest.mark.parametrize("aggregation", AGGS)
@pytest.mark.parametrize("loss_type", ["ppo", "pg"])
def test_policy_loss_with_drop_and_pg_matches_reference(loss_type, aggregation, cap) -> None:
    batch = make_batch(4)
    drop = torch.zeros_like(batch["mask"], dtype=torch.bool)
    drop[0, 2] = drop[1, 5] = drop[4, 4] = True
    drop[2, 1] = True  # not a loss token: ignored
    kw = {**cap, "loss_type": loss_type}
    loss, m = policy_loss(
        batch["logp"],
        batch["prox"],
        batch["behav"],
        batch["adv"],
        batch["mask"],
        aggregation=aggregation,
        drop=drop,
        **kw,
    )
    expected = ref.policy_loss(*as_lists(batch), aggregation=aggregation, drop=drop.tolist(), **kw)
    assert loss.item() == pytest.approx(expected, rel=1e-12, abs=1e-12)
    n = sum(map(sum, MASK))
    assert m["dropped_frac"] == pytest.approx(3 / n)


def test_pg_is_the_uncorrected_gradient() -> None:
    # -A · ∇logp per token, whatever the ratio (no clip, no importance weight when prox == behav)
    behav = torch.tensor([[-1.0, -2.0, -0.5]], dtype=F64)
    logp = (behav + torch.tensor([[2.0, -2.0, 0.0]], dtype=F64)).requires_grad_()
    adv = torch.tensor([[1.0, -1.0, 2.0]], dtype=F64)
    loss, m = policy_loss(logp, behav, behav, adv, torch.ones(1, 3), loss_type="pg", behav_cap=None)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-1 / 3, 1 / 3, -2 / 3])
    assert m["clip_frac"] == 0.0
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(logp, behav, behav, adv, torch.ones(1, 3), loss_type="pg", dual_clip=3.0, behav_cap=None)


def test_importance_ratio_moments() -> None:
    batch = make_batch(5)
    _, m = policy_loss(batch["logp"], batch["prox"], batch["behav"], batch["adv"], batch["mask"], behav_cap=None)
    _, prox, behav, _, mask = as_lists(batch)
    logs = [prox[i][t] - behav[i][t] for i in range(len(mask)) for t in range(len(mask[i])) if mask[i][t]]
    assert m["behav_weight_sq_mean"] == pytest.approx(sum(math.exp(2 * x) for x in logs) / len(logs), rel=1e-12)
    assert m["log_behav_weight_sq_mean"] == pytest.approx(sum(x * x for x in logs) / len(logs), rel=1e-12)
    assert m["dropped_frac"] == 0.0
