"""The objective arms of ``policy_loss`` that the objectives bench compares, pinned on small hand-built
float64 tensors against formulas written out token by token (plain Python, no torch in the reference):

- no behaviour weight (``behav_weight=False``): a PPO clip around π_prox only;
- the behaviour weight with no cap (``behav_cap=None``): the decoupled objective of the AReaL paper;
- the statistics after the cap (``applied_*``): the weight each token's term is really multiplied by.
"""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.algo.losses import policy_loss

EPS = 0.2
# Two rows of four tokens; the last token of row 1 is padding (mask 0, NaN there on purpose).
LOGP = [[-1.0, -0.5, -2.0, -0.3], [-1.2, -0.7, -0.9, math.nan]]
PROX = [[-1.1, -0.9, -1.7, -0.3], [-1.2, -0.4, -1.0, math.nan]]
BEHAV = [[-1.3, -3.4, -1.6, -0.2], [-1.0, -2.9, -1.1, math.nan]]  # w = e^0.2, e^2.5 (12.2 > 5), ...
ADV = [[1.0, -0.5, 2.0, -1.5], [0.7, 1.2, -0.8, 0.0]]
MASK = [[1, 1, 1, 1], [1, 1, 1, 0]]


def _tokens() -> list[tuple[int, int]]:
    return [(i, t) for i in range(2) for t in range(4) if MASK[i][t]]


def _reference(weight_of) -> tuple[float, dict[tuple[int, int], float]]:
    """token_mean loss ``(1/N) Σ a_t · max(-r·A, -clip(r)·A)`` and its gradient in logp, written out:
    the term's derivative is ``-A·r`` where the unclipped branch is the active one and 0 where the
    clipped (constant) branch is; ``a_t = weight_of(w_t)``."""
    toks = _tokens()
    n = len(toks)
    loss, grad = 0.0, {}
    for i, t in toks:
        r = math.exp(LOGP[i][t] - PROX[i][t])
        a = ADV[i][t]
        w = math.exp(PROX[i][t] - BEHAV[i][t])
        unclipped, clipped = -r * a, -min(max(r, 1 - EPS), 1 + EPS) * a
        weight = weight_of(w)
        loss += weight * max(unclipped, clipped) / n
        grad[(i, t)] = weight * (-a * r if unclipped >= clipped else 0.0) / n
    return loss, grad


def _run(**kw) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    args = [torch.tensor(x, dtype=torch.float64) for x in (PROX, BEHAV, ADV)]
    loss, metrics = policy_loss(logp, *args, torch.tensor(MASK), eps_clip=EPS, **kw)
    loss.backward()
    assert logp.grad is not None
    return loss.detach(), logp.grad, metrics


def _check(loss: torch.Tensor, grad: torch.Tensor, ref_loss: float, ref_grad: dict[tuple[int, int], float]) -> None:
    assert loss.item() == pytest.approx(ref_loss, rel=1e-12, abs=1e-14)
    for i in range(2):
        for t in range(4):
            want = ref_grad.get((i, t), 0.0)
            assert grad[i, t].item() == pytest.approx(want, rel=1e-12, abs=1e-14), (i, t)


def test_the_hand_built_batch_exercises_the_cap_and_the_clip() -> None:
    ws = [math.exp(PROX[i][t] - BEHAV[i][t]) for i, t in _tokens()]
    ratios = [math.exp(LOGP[i][t] - PROX[i][t]) for i, t in _tokens()]
    assert sum(w > 5 for w in ws) == 2 and sum(w < 1 for w in ws) >= 2
    assert any(not (1 - EPS <= r <= 1 + EPS) for r in ratios)


def test_no_behaviour_weight_is_a_clip_around_prox_only() -> None:
    loss, grad, metrics = _run(behav_cap=None, behav_weight=False)
    _check(loss, grad, *_reference(lambda w: 1.0))
    assert metrics["applied_weight_mean"] == pytest.approx(1.0) and metrics["applied_weight_max"] == pytest.approx(1.0)
    assert metrics["behav_capped_frac"] == 0.0
    # the raw weight is still reported (it measures staleness); it is just not applied
    raw = [math.exp(PROX[i][t] - BEHAV[i][t]) ** 2 for i, t in _tokens()]
    assert metrics["behav_weight_sq_mean"] == pytest.approx(sum(raw) / len(raw), rel=1e-12)


def test_no_behaviour_weight_differs_from_naive_and_from_decoupled() -> None:
    no_weight, _, _ = _run(behav_cap=None, behav_weight=False)
    decoupled, _, _ = _run(behav_cap=5.0)
    logp = torch.tensor(LOGP, dtype=torch.float64)
    behav = torch.tensor(BEHAV, dtype=torch.float64)
    naive, _ = policy_loss(
        logp, behav, behav, torch.tensor(ADV, dtype=torch.float64), torch.tensor(MASK), eps_clip=EPS, behav_cap=None
    )
    assert abs(no_weight.item() - decoupled.item()) > 1e-3 and abs(no_weight.item() - naive.item()) > 1e-3


def test_uncapped_weight_keeps_every_token() -> None:
    loss, grad, metrics = _run(behav_cap=None)
    _check(loss, grad, *_reference(lambda w: w))
    ws = [math.exp(PROX[i][t] - BEHAV[i][t]) for i, t in _tokens()]
    assert metrics["applied_weight_sq_mean"] == pytest.approx(sum(w * w for w in ws) / len(ws), rel=1e-12)
    assert metrics["applied_weight_max"] == pytest.approx(max(ws), rel=1e-12)
    assert metrics["behav_capped_frac"] == 0.0


def test_capped_weight_against_the_formula() -> None:
    loss, grad, metrics = _run(behav_cap=5.0, behav_cap_mode="mask")
    _check(loss, grad, *_reference(lambda w: w if w <= 5.0 else 0.0))
    loss_c, grad_c, metrics_c = _run(behav_cap=5.0, behav_cap_mode="clamp")
    _check(loss_c, grad_c, *_reference(lambda w: min(w, 5.0)))
    uncapped, _, _ = _run(behav_cap=None)
    assert abs(uncapped.item() - loss.item()) > 1e-3  # the cap acts on this batch: the arms differ


def _applied_stats(weight_of) -> dict[str, float]:
    """The ``applied_*`` statistics written out over the loss tokens."""
    toks = _tokens()
    applied, clipped = [], []
    for i, t in toks:
        w = math.exp(PROX[i][t] - BEHAV[i][t])
        r = math.exp(LOGP[i][t] - PROX[i][t])
        a = weight_of(w)
        applied.append(a)
        active = -min(max(r, 1 - EPS), 1 + EPS) * ADV[i][t] > -r * ADV[i][t]
        clipped.append(1.0 if active and a != 0.0 else 0.0)
    n = len(toks)
    return {
        "applied_weight_mean": sum(applied) / n,
        "applied_weight_sq_mean": sum(a * a for a in applied) / n,
        "applied_weight_max": max(applied),
        "applied_clip_frac": sum(clipped) / n,
    }


@pytest.mark.parametrize(
    ("kw", "weight_of"),
    [
        ({"behav_cap": 5.0, "behav_cap_mode": "mask"}, lambda w: w if w <= 5.0 else 0.0),
        ({"behav_cap": 5.0, "behav_cap_mode": "clamp"}, lambda w: min(w, 5.0)),
        ({"behav_cap": 2.0, "behav_cap_mode": "mask"}, lambda w: w if w <= 2.0 else 0.0),
        ({"behav_cap": None}, lambda w: w),
        ({"behav_cap": None, "behav_weight": False}, lambda w: 1.0),
    ],
)
def test_statistics_after_the_cap(kw, weight_of) -> None:
    _, _, metrics = _run(**kw)
    for key, want in _applied_stats(weight_of).items():
        assert metrics[key] == pytest.approx(want, rel=1e-12, abs=1e-15), key
    raw = [math.exp(PROX[i][t] - BEHAV[i][t]) ** 2 for i, t in _tokens()]
    assert metrics["behav_weight_sq_mean"] == pytest.approx(sum(raw) / len(raw), rel=1e-12)  # before the cap


def test_mask_cap_lowers_the_second_moment_the_gradient_sees() -> None:
    _, _, metrics = _run(behav_cap=5.0)
    assert metrics["applied_weight_sq_mean"] < metrics["behav_weight_sq_mean"] / 10
    assert metrics["applied_weight_max"] <= 5.0


def test_external_drop_counts_as_zero_weight() -> None:
    drop = torch.zeros(2, 4, dtype=torch.bool)
    drop[0, 0] = True
    _, _, metrics = _run(behav_cap=None, behav_weight=False, drop=drop)
    assert metrics["applied_weight_mean"] == pytest.approx(6 / 7, rel=1e-12)
    assert metrics["dropped_frac"] == pytest.approx(1 / 7, rel=1e-12)


def test_no_weight_refuses_a_cap() -> None:
    with pytest.raises(ValueError, match="with behav_weight=False pass behav_cap=None"):
        _run(behav_cap=5.0, behav_weight=False)
