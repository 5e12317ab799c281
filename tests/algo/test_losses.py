"""policy_loss / value_loss / aggregate_loss against hand-computed float64 values and the
plain-loop references in ``_reference.py``; gradients with ``torch.autograd.gradcheck``."""

from __future__ import annotations

import math

import pytest
import torch
from torch.autograd.gradcheck import GradcheckError

from asyncrl.algo.aggregation import aggregate_loss
from asyncrl.algo.losses import policy_loss, value_loss

from . import _reference as ref

F64 = torch.float64
AGGS = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]
LOSS_TYPES = ["ppo", "gspo", "cispo"]
CAPS = [
    {"behav_cap": None},
    {"behav_cap": 2.0, "behav_cap_mode": "mask", "behav_cap_level": "token"},
    {"behav_cap": 2.0, "behav_cap_mode": "clamp", "behav_cap_level": "token"},
    {"behav_cap": 2.0, "behav_cap_mode": "mask", "behav_cap_level": "sequence"},
    {"behav_cap": 2.0, "behav_cap_mode": "clamp", "behav_cap_level": "sequence"},
]
CAP_IDS = ["nocap", "tok-mask", "tok-clamp", "seq-mask", "seq-clamp"]

# Row patterns: prompt prefix + response + padding, full row, no loss token, single token, a gap
# (multi-turn: tool output masked out), short response with lots of padding.
MASK = [
    [0, 0, 1, 1, 1, 1, 0],
    [1, 1, 1, 1, 1, 1, 1],
    [0, 0, 0, 0, 0, 0, 0],
    [0, 0, 0, 1, 0, 0, 0],
    [0, 1, 1, 0, 1, 1, 0],
    [0, 1, 1, 0, 0, 0, 0],
]


def make_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """A float64 batch with ratios spanning the clip range, a ratio of 1e3 and one of 1e-3,
    behaviour weights on both sides of the cap 2.0 (row 1 has geometric-mean weight > 2, row 4
    has one token over 2 but a geometric mean under it), and a few zero advantages."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor(MASK, dtype=F64)
    b, t = mask.shape
    logp = -3.0 * torch.rand(b, t, generator=g, dtype=F64) - 0.05
    log_ratio = torch.empty(b, t, dtype=F64).uniform_(-0.5, 0.5, generator=g)
    log_ratio[0, 3] = math.log(1e3)
    log_ratio[1, 2] = math.log(1e-3)
    prox = logp - log_ratio
    log_w = torch.empty(b, t, dtype=F64).uniform_(-1.0, 0.5, generator=g)
    log_w[1] += 1.0  # geometric mean over the row > log 2
    log_w[4, 2] = 1.2  # a single token over the cap
    behav = prox - log_w
    adv = torch.randn(b, t, generator=g, dtype=F64)
    adv[0, 4] = 0.0
    adv[4, 1] = 0.0
    return {"logp": logp, "prox": prox, "behav": behav, "adv": adv, "mask": mask}


def as_lists(batch):
    return [batch[k].tolist() for k in ("logp", "prox", "behav", "adv", "mask")]


def run(batch, logp=None, **kw):
    lp = batch["logp"] if logp is None else logp
    return policy_loss(lp, batch["prox"], batch["behav"], batch["adv"], batch["mask"], **{"behav_cap": None, **kw})


# ---------------------------------------------------------------- values against the reference


CLIP_CFGS = {"sym": {}, "high": {"eps_clip_high": 0.28}, "dual": {"dual_clip": 3.0}}
REFERENCE_CASES = [
    pytest.param(lt, clip_name, id=f"{lt}-{clip_name}")
    for lt in LOSS_TYPES
    for clip_name in CLIP_CFGS
    if not (lt == "cispo" and clip_name == "dual")  # rejected for CISPO (tested below)
]


@pytest.mark.parametrize("cap", CAPS, ids=CAP_IDS)
@pytest.mark.parametrize("aggregation", AGGS)
@pytest.mark.parametrize(("loss_type", "clip_name"), REFERENCE_CASES)
def test_policy_loss_matches_reference(loss_type, clip_name, aggregation, cap):
    clip_cfg = CLIP_CFGS[clip_name]
    batch = make_batch(1)
    kw = {**cap, **clip_cfg, "loss_type": loss_type}
    loss, _ = run(batch, aggregation=aggregation, **kw)
    expected = ref.policy_loss(*as_lists(batch), aggregation=aggregation, **kw)
    assert loss.dtype == F64 and loss.dim() == 0
    assert loss.item() == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_hand_computed_ppo_example():
    # One sequence, three loss tokens, eps 0.2, w = 1 (prox == behav):
    #   t0: r = 1.5, A = +1 -> min(1.5, 1.2) = 1.2   -> term -1.2 (clipped)
    #   t1: r = 0.5, A = -1 -> min(-0.5, -0.8) = -0.8 -> term +0.8 (clipped)
    #   t2: r = 1.0, A = +2 -> 2                     -> term -2.0
    # token_mean = (-1.2 + 0.8 - 2.0) / 3 = -0.8
    prox = torch.tensor([[-1.0, -2.0, -0.5]], dtype=F64)
    logp = prox + torch.log(torch.tensor([[1.5, 0.5, 1.0]], dtype=F64))
    adv = torch.tensor([[1.0, -1.0, 2.0]], dtype=F64)
    mask = torch.ones(1, 3, dtype=F64)
    loss, m = policy_loss(logp, prox, prox, adv, mask, behav_cap=None)
    assert loss.item() == pytest.approx(-0.8, abs=1e-12)
    assert m["clip_frac"] == pytest.approx(2 / 3)
    assert m["behav_weight_mean"] == pytest.approx(1.0) and m["behav_weight_max"] == pytest.approx(1.0)
    assert m["ratio_mean"] == pytest.approx(1.0)
    # k3 to prox: mean((r - 1) - log r) over r = 1.5, 0.5, 1
    k3 = ((0.5 - math.log(1.5)) + (-0.5 - math.log(0.5)) + 0.0) / 3
    assert m["approx_kl_prox"] == pytest.approx(k3, rel=1e-12)
    assert m["approx_kl_behav"] == pytest.approx(k3, rel=1e-12)  # behav == prox
    # clip-higher 0.6: t0 no longer clipped -> (-1.5 + 0.8 - 2) / 3 = -0.9
    loss_high, _ = policy_loss(logp, prox, prox, adv, mask, eps_clip_high=0.6, behav_cap=None)
    assert loss_high.item() == pytest.approx(-0.9, abs=1e-12)


def test_hand_computed_decoupled_and_dual_clip():
    # Two tokens, r = [5, 1], A = [-1, 1], w = [2, 0.5]:
    #   t0: PPO term max(5, 0.8)... = -min(-5, -1.2) = 5; dual clip 3 -> min(5, 3) = 3; x w=2 -> 6
    #   t1: -1 x w=0.5 -> -0.5.   token_mean = (6 - 0.5) / 2 = 2.75; without dual (10 - 0.5)/2 = 4.75
    prox = torch.tensor([[-1.0, -1.0]], dtype=F64)
    logp = prox + torch.log(torch.tensor([[5.0, 1.0]], dtype=F64))
    behav = prox - torch.log(torch.tensor([[2.0, 0.5]], dtype=F64))
    adv = torch.tensor([[-1.0, 1.0]], dtype=F64)
    mask = torch.ones(1, 2)
    loss, m = policy_loss(logp, prox, behav, adv, mask, dual_clip=3.0, behav_cap=None)
    assert loss.item() == pytest.approx(2.75, abs=1e-12)
    assert m["dual_clip_frac"] == pytest.approx(0.5)
    assert m["behav_weight_mean"] == pytest.approx(1.25) and m["behav_weight_max"] == pytest.approx(2.0)
    loss_nodual, _ = policy_loss(logp, prox, behav, adv, mask, behav_cap=None)
    assert loss_nodual.item() == pytest.approx(4.75, abs=1e-12)
    # cap 1.5: mask drops t0 but keeps it in the denominator -> -0.5 / 2; clamp -> (3*1.5 - 0.5)/2
    masked, mm = policy_loss(logp, prox, behav, adv, mask, dual_clip=3.0, behav_cap=1.5)
    assert masked.item() == pytest.approx(-0.25, abs=1e-12)
    assert mm["behav_capped_frac"] == pytest.approx(0.5)
    clamped, _ = policy_loss(logp, prox, behav, adv, mask, dual_clip=3.0, behav_cap=1.5, behav_cap_mode="clamp")
    assert clamped.item() == pytest.approx(2.0, abs=1e-12)
    # sequence level: geometric mean of w = sqrt(2 * 0.5) = 1 -> not capped by 1.5; clamp uses 1 for all
    seq_mask, _ = policy_loss(logp, prox, behav, adv, mask, dual_clip=3.0, behav_cap=1.5, behav_cap_level="sequence")
    assert seq_mask.item() == pytest.approx(2.75, abs=1e-12)
    seq_clamp, _ = policy_loss(
        logp,
        prox,
        behav,
        adv,
        mask,
        dual_clip=3.0,
        behav_cap=1.5,
        behav_cap_level="sequence",
        behav_cap_mode="clamp",
    )
    assert seq_clamp.item() == pytest.approx((3.0 - 1.0) / 2, abs=1e-12)
    seq_low, _ = policy_loss(
        logp,
        prox,
        behav,
        adv,
        mask,
        dual_clip=3.0,
        behav_cap=0.9,
        behav_cap_level="sequence",
        behav_cap_mode="clamp",
    )
    assert seq_low.item() == pytest.approx((3.0 * 0.9 - 0.9) / 2, abs=1e-12)


def test_hand_computed_aggregations():
    # terms (w = 1, r = 1 -> term = -A): row0 = [-1, -2, pad], row1 = [-3, pad, pad]
    logp = torch.zeros(2, 3, dtype=F64)
    adv = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    expect = {
        "token_mean": -6.0 / 3,
        "seq_mean_token_mean": (-1.5 + -3.0) / 2,
        "seq_mean_token_sum": -6.0 / (2 * 3),
    }
    for agg, value in expect.items():
        loss, _ = policy_loss(logp, logp, logp, adv, mask, aggregation=agg, behav_cap=None)
        assert loss.item() == pytest.approx(value, abs=1e-12), agg
        assert aggregate_loss(-adv, mask, agg).item() == pytest.approx(value, abs=1e-12), agg


def test_extreme_ratios():
    # r = 1e3 and 1e-3 against both advantage signs, eps 0.2, one token per row, token_mean over 4
    prox = torch.full((4, 1), -2.0, dtype=F64)
    ratios = torch.tensor([[1e3], [1e3], [1e-3], [1e-3]], dtype=F64)
    logp = (prox + ratios.log()).requires_grad_()
    adv = torch.tensor([[1.0], [-1.0], [1.0], [-1.0]], dtype=F64)
    mask = torch.ones(4, 1)
    loss, m = policy_loss(logp, prox, prox, adv, mask, behav_cap=None)
    # terms: -1.2 (clipped), +1e3 (unclipped), -1e-3 (unclipped), +0.8 (clipped)
    assert loss.item() == pytest.approx((-1.2 + 1e3 - 1e-3 + 0.8) / 4, rel=1e-12)
    (grad,) = torch.autograd.grad(loss, logp)
    # d(-r A)/dlogp = -r A where unclipped, 0 where clipped
    expected = torch.tensor([[0.0], [1e3 / 4], [-1e-3 / 4], [0.0]], dtype=F64)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)
    assert m["clip_frac"] == pytest.approx(0.5)
    loss_dual, _ = policy_loss(logp, prox, prox, adv, mask, dual_clip=3.0, behav_cap=None)
    assert loss_dual.item() == pytest.approx((-1.2 + 3.0 - 1e-3 + 0.8) / 4, rel=1e-12)


# ---------------------------------------------------------------- masking, edge cases


@pytest.mark.parametrize("aggregation", AGGS)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_no_loss_tokens_gives_zero_not_nan(loss_type, aggregation):
    batch = make_batch(2)
    batch["mask"] = torch.zeros_like(batch["mask"])
    logp = batch["logp"].clone().requires_grad_()
    loss, m = run(
        batch,
        logp=logp,
        loss_type=loss_type,
        aggregation=aggregation,
        behav_cap=2.0,
        behav_cap_level="sequence",
    )
    assert loss.item() == 0.0
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.equal(grad, torch.zeros_like(grad))
    assert all(v == 0.0 for v in m.values()), m


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_zero_advantages_give_zero_loss_and_grad(loss_type):
    batch = make_batch(3)
    batch["adv"] = torch.zeros_like(batch["adv"])
    logp = batch["logp"].clone().requires_grad_()
    loss, _ = run(batch, logp=logp, loss_type=loss_type)
    assert loss.item() == 0.0
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.count_nonzero(grad) == 0


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_all_tokens_capped(loss_type, level):
    batch = make_batch(4)
    batch["behav"] = batch["prox"] - 3.0  # w = e^3 > 2 everywhere
    logp = batch["logp"].clone().requires_grad_()
    loss, m = run(batch, logp=logp, loss_type=loss_type, behav_cap=2.0, behav_cap_level=level)
    assert loss.item() == 0.0
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.count_nonzero(grad) == 0
    assert m["behav_capped_frac"] == 1.0
    assert m["behav_weight_mean"] == pytest.approx(math.exp(3.0))
    clamped, mc = run(batch, loss_type=loss_type, behav_cap=2.0, behav_cap_level=level, behav_cap_mode="clamp")
    uncapped_w1, _ = run({**batch, "behav": batch["prox"]}, loss_type=loss_type)
    assert clamped.item() == pytest.approx(2.0 * uncapped_w1.item(), rel=1e-12)
    assert mc["behav_capped_frac"] == 1.0


def test_masked_tokens_stay_in_denominator():
    # Two tokens with term -1 each; the second has w = 10 > cap: masked -> -1 / 2, not -1 / 1.
    logp = torch.zeros(1, 2, dtype=F64)
    behav = torch.tensor([[0.0, -math.log(10.0)]], dtype=F64)
    adv = torch.ones(1, 2, dtype=F64)
    loss, _ = policy_loss(logp, logp, behav, adv, torch.ones(1, 2), behav_cap=5.0)
    assert loss.item() == pytest.approx(-0.5, abs=1e-12)
    loss_seq, _ = policy_loss(
        logp, logp, behav, adv, torch.ones(1, 2), behav_cap=5.0, aggregation="seq_mean_token_mean"
    )
    assert loss_seq.item() == pytest.approx(-0.5, abs=1e-12)


@pytest.mark.parametrize("cap", CAPS, ids=CAP_IDS)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_nonfinite_masked_inputs_do_not_poison(loss_type, cap):
    batch = make_batch(5)
    clean_loss, clean_m = run(batch, loss_type=loss_type, aggregation="seq_mean_token_mean", **cap)
    dirty = {k: v.clone() for k, v in batch.items()}
    off = dirty["mask"] == 0
    dirty["logp"][off] = -math.inf
    dirty["logp"][2] = math.nan
    dirty["prox"][off] = math.nan
    dirty["behav"][off] = math.inf
    dirty["adv"][off] = math.nan
    logp = dirty["logp"].clone().requires_grad_()
    loss, m = run(dirty, logp=logp, loss_type=loss_type, aggregation="seq_mean_token_mean", **cap)
    assert torch.isfinite(loss)
    assert loss.item() == pytest.approx(clean_loss.item(), rel=1e-12, abs=1e-15)
    assert m == pytest.approx(clean_m)
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(grad).all()
    assert torch.count_nonzero(grad[off]) == 0


def test_standard_ppo_is_prox_equal_behav():
    batch = make_batch(6)
    b = batch
    loss, m = policy_loss(b["logp"], b["prox"], b["prox"], b["adv"], b["mask"], behav_cap=1.5)
    assert m["behav_weight_mean"] == 1.0 and m["behav_weight_max"] == 1.0 and m["behav_capped_frac"] == 0.0
    lists = as_lists(batch)
    expected = ref.policy_loss(lists[0], lists[1], lists[1], lists[3], lists[4])
    assert loss.item() == pytest.approx(expected, rel=1e-12)


def test_metrics_against_reference():
    batch = make_batch(7)
    _, m = run(batch, behav_cap=2.0)
    logp, prox, behav, _, mask = as_lists(batch)
    toks = [(i, t) for i in range(len(mask)) for t in range(len(mask[i])) if mask[i][t]]
    ws = [math.exp(prox[i][t] - behav[i][t]) for i, t in toks]
    rs = [math.exp(logp[i][t] - prox[i][t]) for i, t in toks]
    rhos = [math.exp(logp[i][t] - behav[i][t]) for i, t in toks]
    assert m["n_loss_tokens"] == len(toks)
    assert m["behav_weight_mean"] == pytest.approx(sum(ws) / len(ws), rel=1e-12)
    assert m["behav_weight_max"] == pytest.approx(max(ws), rel=1e-12)
    assert m["behav_capped_frac"] == pytest.approx(sum(w > 2.0 for w in ws) / len(ws))
    assert m["ratio_mean"] == pytest.approx(sum(rs) / len(rs), rel=1e-12)
    assert m["approx_kl_prox"] == pytest.approx(sum(r - 1 - math.log(r) for r in rs) / len(rs), rel=1e-10)
    assert m["approx_kl_behav"] == pytest.approx(sum(r - 1 - math.log(r) for r in rhos) / len(rs), rel=1e-10)
    assert 0.0 < m["behav_capped_frac"] < 1.0 and 0.0 < m["clip_frac"] < 1.0


def test_advantages_broadcast_per_sequence():
    batch = make_batch(8)
    seq_adv = torch.randn(6, 1, dtype=F64, generator=torch.Generator().manual_seed(0))
    a, _ = policy_loss(batch["logp"], batch["prox"], batch["behav"], seq_adv, batch["mask"], behav_cap=None)
    b, _ = policy_loss(
        batch["logp"], batch["prox"], batch["behav"], seq_adv.expand(6, 7), batch["mask"], behav_cap=None
    )
    assert a.item() == pytest.approx(b.item(), rel=1e-14)


def test_low_precision_inputs_computed_in_float32():
    batch = {k: v.to(torch.bfloat16) for k, v in make_batch(9).items()}
    loss, _ = run(batch)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)


# ---------------------------------------------------------------- GSPO / CISPO specifics


def test_gspo_single_token_sequences_equal_ppo():
    batch = make_batch(10)
    single = torch.zeros_like(batch["mask"])
    single[[0, 1, 3, 4], [2, 4, 3, 1]] = 1
    batch["mask"] = single
    ppo, _ = run(batch, loss_type="ppo", dual_clip=3.0)
    gspo, _ = run(batch, loss_type="gspo", dual_clip=3.0)
    assert gspo.item() == pytest.approx(ppo.item(), rel=1e-12)


def test_gspo_gradient_is_shared_across_the_sequence():
    # One sequence, constant A, ratio inside the clip range: d loss / d logp_t = -A s / n / n for
    # token_mean (s = sequence ratio): the same for every token, even where the token ratio is off.
    logp = torch.tensor([[-1.0, -2.0, -0.5, -3.0]], dtype=F64, requires_grad=True)
    prox = logp.detach() - torch.tensor([[0.3, -0.2, 0.1, -0.1]], dtype=F64)  # mean log-ratio 0.025
    adv = torch.full((1, 4), 2.0, dtype=F64)
    loss, m = policy_loss(logp, prox, prox, adv, torch.ones(1, 4), loss_type="gspo", behav_cap=None)
    s = math.exp(0.025)
    assert loss.item() == pytest.approx(-2.0 * s, rel=1e-12)
    assert m["ratio_mean"] == pytest.approx(s, rel=1e-12)
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(grad, torch.full((1, 4), -2.0 * s / 4, dtype=F64), rtol=1e-12, atol=0)
    # a sequence ratio outside the clip range cuts the whole sequence (A > 0, s > 1.2)
    far = logp.detach() - 0.5
    loss_far, m_far = policy_loss(logp, far, far, adv, torch.ones(1, 4), loss_type="gspo", behav_cap=None)
    (grad_far,) = torch.autograd.grad(loss_far, logp)
    assert loss_far.item() == pytest.approx(-2.0 * 1.2, rel=1e-12)
    assert torch.count_nonzero(grad_far) == 0 and m_far["clip_frac"] == 1.0


@pytest.mark.parametrize("cap", CAPS, ids=CAP_IDS)
@pytest.mark.parametrize("aggregation", AGGS)
def test_cispo_gradient_matches_reference(aggregation, cap):
    batch = make_batch(11)
    logp = batch["logp"].clone().requires_grad_()
    loss, m = run(batch, logp=logp, loss_type="cispo", aggregation=aggregation, eps_clip_high=0.5, **cap)
    (grad,) = torch.autograd.grad(loss, logp)
    expected = ref.cispo_grad(*as_lists(batch), aggregation=aggregation, eps_clip_high=0.5, **cap)
    torch.testing.assert_close(grad, torch.tensor(expected, dtype=F64), rtol=1e-12, atol=1e-15)
    assert m["clip_frac"] > 0.0  # the 1e3 and 1e-3 ratios at least


def test_cispo_keeps_gradient_where_ppo_clips():
    # r = 1e3, A = +1: PPO's gradient is 0 (clipped); CISPO's is -clip(r) A / n = -1.2.
    prox = torch.tensor([[-2.0]], dtype=F64)
    logp = (prox + math.log(1e3)).requires_grad_()
    adv = torch.ones(1, 1, dtype=F64)
    loss, _ = policy_loss(logp, prox, prox, adv, torch.ones(1, 1), loss_type="cispo", behav_cap=None)
    (grad,) = torch.autograd.grad(loss, logp)
    assert grad.item() == pytest.approx(-1.2, rel=1e-12)
    # no lower bound with eps_clip >= 1: r = 1e-3 keeps its weight 1e-3
    logp_low = (prox + math.log(1e-3)).requires_grad_()
    loss_low, _ = policy_loss(
        logp_low, prox, prox, adv, torch.ones(1, 1), loss_type="cispo", eps_clip=1.0, behav_cap=None
    )
    (grad_low,) = torch.autograd.grad(loss_low, logp_low)
    assert grad_low.item() == pytest.approx(-1e-3, rel=1e-9)


# ---------------------------------------------------------------- gradcheck (float64)


@pytest.mark.parametrize(
    "cap",
    [{}, {"behav_cap": 2.0}, {"behav_cap": 2.0, "behav_cap_level": "sequence", "behav_cap_mode": "clamp"}],
    ids=["nocap", "tok-mask", "seq-clamp"],
)
@pytest.mark.parametrize("aggregation", AGGS)
@pytest.mark.parametrize("loss_type", ["ppo", "gspo"])
def test_gradcheck(loss_type, aggregation, cap):
    batch = make_batch(12)
    logp = batch["logp"].clone().requires_grad_()

    def f(x):
        return run(
            batch,
            logp=x,
            loss_type=loss_type,
            aggregation=aggregation,
            dual_clip=3.0,
            eps_clip_high=0.28,
            **cap,
        )[0]

    assert torch.autograd.gradcheck(f, (logp,), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_gradcheck_cispo_is_not_the_value_gradient_by_design():
    # CISPO's surrogate stops the gradient through the weight: its gradient is the reference's
    # (tested above), deliberately *not* the numerical derivative of the loss value.
    batch = make_batch(13)
    logp = batch["logp"].clone().requires_grad_()
    with pytest.raises(GradcheckError):
        torch.autograd.gradcheck(lambda x: run(batch, logp=x, loss_type="cispo")[0], (logp,), eps=1e-6)


# ---------------------------------------------------------------- micro-batching and packing


def global_denominator(mask: torch.Tensor, aggregation: str) -> float:
    match aggregation:
        case "token_mean":
            return float((mask != 0).sum())
        case "seq_mean_token_mean":
            return float(((mask != 0).sum(-1) > 0).sum())
        case _:
            return float(mask.shape[0] * mask.shape[1])


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("aggregation", AGGS)
def test_micro_batches_with_global_denominator_sum_to_whole(aggregation, loss_type):
    batch = make_batch(14)
    kw = {"loss_type": loss_type, "aggregation": aggregation, "behav_cap": 2.0, "behav_cap_level": "sequence"}
    logp = batch["logp"].clone().requires_grad_()
    whole, _ = run(batch, logp=logp, **kw)
    (whole_grad,) = torch.autograd.grad(whole, logp)
    den = global_denominator(batch["mask"], aggregation)
    total = torch.zeros((), dtype=F64)
    grads = []
    for rows in ([0, 1], [2], [3, 4, 5]):
        micro = {k: v[rows] for k, v in batch.items()}
        lp = micro["logp"].clone().requires_grad_()
        part, _ = run(micro, logp=lp, denominator=den, **kw)
        (g,) = torch.autograd.grad(part, lp)
        total = total + part.detach()
        grads.append(g)
    assert total.item() == pytest.approx(whole.item(), rel=1e-12, abs=1e-14)
    torch.testing.assert_close(torch.cat(grads), whole_grad, rtol=1e-12, atol=1e-15)
    # without the global denominator the micro-batch losses do not add up (the test can fail)
    local = sum(run({k: v[r] for k, v in batch.items()}, **kw)[0].item() for r in ([0, 1], [2], [3, 4, 5]))
    assert local != pytest.approx(whole.item(), rel=1e-6)


@pytest.mark.parametrize("cap", CAPS, ids=CAP_IDS)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("aggregation", AGGS)
def test_packed_row_equals_padded_batch(aggregation, loss_type, cap):
    batch = make_batch(15)
    mask = batch["mask"]
    # strip each row's right padding (keep prompt positions), then pack all rows into one [1, N] row
    lengths = [int(torch.nonzero(row).max()) + 1 if row.any() else 2 for row in mask]
    packed = {k: torch.cat([v[i, :n] for i, n in enumerate(lengths)]).unsqueeze(0) for k, v in batch.items()}
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    den = global_denominator(mask, aggregation) if aggregation == "seq_mean_token_sum" else None
    kw = {"loss_type": loss_type, "aggregation": aggregation, "denominator": den, **cap}
    logp = batch["logp"].clone().requires_grad_()
    padded, m_pad = run(batch, logp=logp, **kw)
    lp = packed["logp"].clone().requires_grad_()
    packed_loss, m_pack = run(packed, logp=lp, cu_seqlens=cu, **kw)
    assert packed_loss.item() == pytest.approx(padded.item(), rel=1e-12, abs=1e-15)
    assert m_pack == pytest.approx(m_pad)
    (g_pad,) = torch.autograd.grad(padded, logp)
    (g_pack,) = torch.autograd.grad(packed_loss, lp)
    torch.testing.assert_close(g_pack[0], torch.cat([g_pad[i, :n] for i, n in enumerate(lengths)]))
    flat = run({k: v[0] for k, v in packed.items()}, cu_seqlens=cu, **kw)[0]  # 1-D [N] works too
    assert flat.item() == pytest.approx(padded.item(), rel=1e-12, abs=1e-15)


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"loss_type": "grpo"}, "valid choices: ppo, gspo, cispo"),
        ({"aggregation": "mean"}, "valid choices: token_mean"),
        ({"behav_cap_mode": "drop"}, "valid choices: mask, clamp"),
        ({"behav_cap_level": "batch"}, "valid choices: token, sequence"),
        ({"dual_clip": 1.0}, "dual_clip must be > 1"),
        ({"dual_clip": 3.0, "loss_type": "cispo"}, "cispo"),
        ({"behav_cap": 0.0}, "behav_cap must be > 0"),
        ({"eps_clip": -0.1}, "must be >= 0"),
        ({"denominator": 0.0}, "denominator must be > 0"),
    ],
)
def test_invalid_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        run(make_batch(0), **kw)


def test_invalid_shapes_and_packing():
    b = make_batch(0)
    with pytest.raises(ValueError, match="prox_logp shape"):
        policy_loss(b["logp"], b["prox"][:, :3], b["behav"], b["adv"], b["mask"], behav_cap=None)
    with pytest.raises(ValueError, match="does not broadcast"):
        policy_loss(b["logp"], b["prox"], b["behav"], b["adv"][:, :2], b["mask"], behav_cap=None)
    flat = {k: v.reshape(-1) for k, v in b.items()}
    with pytest.raises(ValueError, match="cu_seqlens must start at 0"):
        run(flat, cu_seqlens=torch.tensor([0, 5, 40]))
    with pytest.raises(ValueError, match="explicit denominator"):
        run(flat, cu_seqlens=torch.tensor([0, 20, 42]), aggregation="seq_mean_token_sum")
    with pytest.raises(ValueError, match="for a packed row pass cu_seqlens"):
        run(flat, aggregation="seq_mean_token_mean")
    with pytest.raises(ValueError, match="valid choices"):
        aggregate_loss(b["adv"], b["mask"], "sum")


# ---------------------------------------------------------------- value loss


def ref_value_loss(values, old, returns, mask, clip):
    total, n = 0.0, 0
    for i in range(len(values)):
        for t in range(len(values[i])):
            if not mask[i][t]:
                continue
            v, o, r = values[i][t], old[i][t], returns[i][t]
            err = (v - r) ** 2
            if clip is not None:
                v_clip = o + min(max(v - o, -clip), clip)
                err = max(err, (v_clip - r) ** 2)
            total += 0.5 * err
            n += 1
    return total / max(n, 1)


@pytest.mark.parametrize("clip", [0.2, None])
def test_value_loss_matches_reference_and_gradcheck(clip):
    g = torch.Generator().manual_seed(3)
    mask = torch.tensor(MASK, dtype=F64)
    values = torch.randn(6, 7, generator=g, dtype=F64)
    old = values + 0.5 * torch.randn(6, 7, generator=g, dtype=F64)
    returns = torch.randn(6, 7, generator=g, dtype=F64)
    loss = value_loss(values, old, returns, mask, clip=clip)
    expected = ref_value_loss(values.tolist(), old.tolist(), returns.tolist(), mask.tolist(), clip)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    dirty_values = values.clone()
    dirty_values[mask == 0] = math.nan
    x = dirty_values.requires_grad_()
    (grad,) = torch.autograd.grad(value_loss(x, old, returns, mask, clip=clip), x)
    assert torch.isfinite(grad).all() and torch.count_nonzero(grad[mask == 0]) == 0
    assert torch.autograd.gradcheck(
        lambda v: value_loss(v, old, returns, mask, clip=clip), (values.clone().requires_grad_(),), eps=1e-6
    )
    # hand value: V = 1, V_old = 0, R = 0, clip 0.2 -> max(1, 0.04) / 2 = 0.5; R = 1.2 -> max(0.04, 1) / 2
    one = torch.ones(1, 1, dtype=F64)
    zero = torch.zeros(1, 1, dtype=F64)
    assert value_loss(one, zero, zero, one).item() == pytest.approx(0.5)
    assert value_loss(one, zero, 1.2 * one, one).item() == pytest.approx(0.5)
    assert value_loss(one, zero, 1.2 * one, one, clip=None).item() == pytest.approx(0.5 * 0.04)
