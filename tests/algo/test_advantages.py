"""Advantage estimators against hand-computed float64 values and plain-loop references."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.algo.advantages import (
    compute_advantages,
    dr_grpo_advantages,
    gae_advantages,
    grpo_advantages,
    informative_groups,
    normalize_batch,
    overlong_penalty,
    reinforce_pp_advantages,
    rloo_advantages,
)

from . import _reference as ref

F64 = torch.float64


def rewards_batch(seed: int = 0) -> torch.Tensor:
    """Groups of 5: continuous, 0/1, all-equal (all correct / all wrong), AReaL-scaled ±5."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack(
        [
            torch.randn(5, generator=g, dtype=F64),
            torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0], dtype=F64),
            torch.ones(5, dtype=F64),
            torch.zeros(5, dtype=F64),
            torch.tensor([5.0, -5.0, -5.0, -5.0, -5.0], dtype=F64),
            torch.full((5,), 0.1, dtype=F64),  # float mean != 0.1 exactly
        ]
    )


def close(actual: torch.Tensor, expected, rel: float = 1e-12, abs_: float = 1e-12) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), rtol=rel, atol=abs_)


# ---------------------------------------------------------------- GRPO family


def test_grpo_hand_values_use_population_std():
    # [1, 0, 0, 0]: mean 0.25, population std sqrt(0.1875) -> A_0 = 0.75 / 0.4330127 = sqrt(3)
    # (the unbiased std would give 1.5 instead)
    a = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=F64), eps=0.0)
    close(a, [[math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)]])
    # [0, 1] with eps 1e-6: mean 0.5, std 0.5 -> ±0.5 / 0.500001
    b = grpo_advantages(torch.tensor([[0.0, 1.0]], dtype=F64))
    close(b, [[-0.5 / 0.500001, 0.5 / 0.500001]])


def test_grpo_matches_reference_and_uniform_groups_are_exactly_zero():
    r = rewards_batch()
    a = grpo_advantages(r)
    close(a, ref.grpo(r.tolist(), 1e-6))
    assert torch.equal(a[2:4], torch.zeros(2, 5, dtype=F64))
    assert torch.equal(a[5], torch.zeros(5, dtype=F64))  # 0.1s: no 1e-11 residue
    assert torch.equal(grpo_advantages(torch.ones(3, 4), eps=0.0), torch.zeros(3, 4))  # no 0/0


def test_grpo_single_sample_groups_are_zero_not_nan():
    a = grpo_advantages(torch.tensor([[3.0], [-1.0]], dtype=F64))
    assert torch.equal(a, torch.zeros(2, 1, dtype=F64))
    assert torch.equal(dr_grpo_advantages(torch.tensor([[3.0]])), torch.zeros(1, 1))
    assert torch.equal(reinforce_pp_advantages(torch.tensor([[3.0], [2.0]])), torch.zeros(2, 1))


def test_dr_grpo_is_mean_only():
    r = rewards_batch()
    expected = [[x - ref.mean(row) for x in row] for row in r.tolist()]
    expected[5] = [0.0] * 5
    close(dr_grpo_advantages(r), expected)
    close(dr_grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=F64)), [[0.75, -0.25, -0.25, -0.25]])


def test_rloo_leave_one_out():
    r = rewards_batch()
    close(rloo_advantages(r), ref.rloo(r.tolist()), abs_=1e-12)
    # [1, 0, 0]: 1 - 0 = 1; 0 - (1 + 0) / 2 = -0.5
    close(rloo_advantages(torch.tensor([[1.0, 0.0, 0.0]], dtype=F64)), [[1.0, -0.5, -0.5]])
    assert torch.equal(rloo_advantages(torch.full((2, 3), 0.1)), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="at least 2 samples"):
        rloo_advantages(torch.ones(4, 1))


def test_reinforce_pp_group_baseline_then_batch_std():
    r = rewards_batch()
    close(reinforce_pp_advantages(r), ref.reinforce_pp(r.tolist(), 1e-6))
    # two groups [1, 0] and [3, 3]: centred [0.5, -0.5, 0, 0], batch pop std sqrt(0.125)
    a = reinforce_pp_advantages(torch.tensor([[1.0, 0.0], [3.0, 3.0]], dtype=F64), eps=0.0)
    s = math.sqrt(0.125)
    close(a, [[0.5 / s, -0.5 / s], [0.0, 0.0]])
    assert torch.equal(reinforce_pp_advantages(torch.ones(3, 4), eps=0.0), torch.zeros(3, 4))


def test_integer_rewards_and_no_gradient():
    a = grpo_advantages(torch.tensor([[1, 0]]))
    assert a.is_floating_point()
    r = torch.tensor([[1.0, 0.0, 2.0]], requires_grad=True)
    for est in ("grpo", "dr_grpo", "rloo", "reinforce_pp"):
        assert not compute_advantages(r, est).requires_grad


def test_compute_advantages_dispatch():
    r = rewards_batch(1)
    assert torch.equal(compute_advantages(r, "grpo"), grpo_advantages(r))
    assert torch.equal(compute_advantages(r, "grpo", eps=0.5), grpo_advantages(r, eps=0.5))
    assert torch.equal(compute_advantages(r, "dr_grpo"), dr_grpo_advantages(r))
    assert torch.equal(compute_advantages(r, "rloo"), rloo_advantages(r))
    assert torch.equal(compute_advantages(r, "reinforce_pp"), reinforce_pp_advantages(r))
    with pytest.raises(ValueError, match="valid choices: grpo, dr_grpo, rloo, reinforce_pp"):
        compute_advantages(r, "gae")


def test_rewards_shape_is_checked():
    with pytest.raises(ValueError, match=r"\[num_groups, G\]"):
        grpo_advantages(torch.ones(4))
    with pytest.raises(ValueError, match=r"\[num_groups, G\]"):
        dr_grpo_advantages(torch.ones(2, 0))


# ---------------------------------------------------------------- batch normalisation


def test_normalize_batch_hand_values():
    # [1, 2, 3, 4]: mean 2.5, population std sqrt(1.25)
    a = normalize_batch(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64), eps=0.0)
    s = math.sqrt(1.25)
    close(a, [-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s])


def test_normalize_batch_with_mask_ignores_masked_entries():
    adv = torch.tensor([[1.0, 3.0, math.nan], [5.0, math.inf, 7.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    out = normalize_batch(adv, mask, eps=1e-6)
    vals = [1.0, 3.0, 5.0, 7.0]
    m, s = ref.mean(vals), ref.pop_std(vals)
    close(
        out,
        [
            [(1 - m) / (s + 1e-6), (3 - m) / (s + 1e-6), 0.0],
            [(5 - m) / (s + 1e-6), 0.0, (7 - m) / (s + 1e-6)],
        ],
    )


def test_normalize_batch_degenerate_cases():
    assert torch.equal(normalize_batch(torch.full((2, 3), 0.1), eps=0.0), torch.zeros(2, 3))
    assert torch.equal(normalize_batch(torch.ones(2, 3), torch.zeros(2, 3)), torch.zeros(2, 3))
    one = normalize_batch(torch.tensor([[4.0, 9.0]]), torch.tensor([[1, 0]]))
    assert torch.equal(one, torch.zeros(1, 2))


# ---------------------------------------------------------------- GAE


GAE_MASK = [
    [0, 0, 1, 1, 1, 0],  # prompt, response, padding
    [1, 1, 1, 1, 1, 1],
    [0, 1, 1, 0, 1, 1],  # a masked-out tool span in the middle
    [0, 0, 0, 0, 0, 0],
    [0, 0, 0, 0, 1, 0],
]


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.5, 0.0), (0.9, 1.0)])
def test_gae_matches_reference(gamma, lam):
    g = torch.Generator().manual_seed(4)
    mask = torch.tensor(GAE_MASK)
    rewards = torch.randn(5, 6, generator=g, dtype=F64)
    values = torch.randn(5, 6, generator=g, dtype=F64)
    adv, ret = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
    exp_adv, exp_ret = ref.gae(rewards.tolist(), values.tolist(), GAE_MASK, gamma, lam)
    close(adv, exp_adv)
    close(ret, exp_ret)


def test_gae_hand_values():
    # steps: r = [0, 0, 1], V = [0.5, 0.6, 0.7], γ = 0.9, λ = 0.8 (episode ends after the last token)
    # δ2 = 1 - 0.7 = 0.3;  δ1 = 0 + 0.9·0.7 - 0.6 = 0.03;  δ0 = 0 + 0.9·0.6 - 0.5 = 0.04
    # A2 = 0.3;  A1 = 0.03 + 0.72·0.3 = 0.246;  A0 = 0.04 + 0.72·0.246 = 0.21712
    r = torch.tensor([[0.0, 0.0, 1.0, 0.0]], dtype=F64)
    v = torch.tensor([[0.5, 0.6, 0.7, 123.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0]])
    adv, ret = gae_advantages(r, v, mask, gamma=0.9, lam=0.8)
    close(adv, [[0.21712, 0.246, 0.3, 0.0]])
    close(ret, [[0.71712, 0.846, 1.0, 0.0]])


def test_gae_without_critic_is_reward_to_go():
    r = torch.tensor([[0.0, 0.0, 0.5, 0.0, 2.0, 0.0]], dtype=F64)
    mask = torch.tensor([[0, 1, 1, 0, 1, 0]])
    adv, ret = gae_advantages(r, torch.zeros_like(r), mask)
    close(adv, [[0.0, 2.5, 2.5, 0.0, 2.0, 0.0]])
    assert torch.equal(adv, ret)


def test_gae_ignores_nonfinite_masked_values_and_has_no_grad():
    g = torch.Generator().manual_seed(5)
    mask = torch.tensor(GAE_MASK)
    rewards = torch.randn(5, 6, generator=g, dtype=F64)
    values = torch.randn(5, 6, generator=g, dtype=F64)
    clean = gae_advantages(rewards, values, mask, gamma=0.95, lam=0.9)
    dirty_r, dirty_v = rewards.clone(), values.clone()
    dirty_r[mask == 0] = math.nan
    dirty_v[mask == 0] = math.inf
    dirty_v.requires_grad_()
    adv, ret = gae_advantages(dirty_r, dirty_v, mask, gamma=0.95, lam=0.9)
    assert not adv.requires_grad and not ret.requires_grad
    assert torch.equal(adv, clean[0]) and torch.equal(ret, clean[1])
    assert torch.equal(adv[3], torch.zeros(6, dtype=F64))
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        gae_advantages(rewards, values[:, :3], mask)


# ---------------------------------------------------------------- shaping helpers


def test_informative_groups():
    r = rewards_batch()
    assert informative_groups(r).tolist() == [True, True, False, False, True, False]
    assert informative_groups(torch.tensor([[1.0]])).tolist() == [False]


def test_overlong_penalty():
    # max 100, buffer 20: <= 80 -> 0; 90 -> -0.5 * penalty; 100 -> -penalty; 120 -> -penalty
    lengths = torch.tensor([10, 80, 90, 100, 120])
    close(overlong_penalty(lengths, 100, 20, penalty=2.0).double(), [0.0, 0.0, -1.0, -2.0, -2.0])
    with pytest.raises(ValueError, match="buffer_length"):
        overlong_penalty(lengths, 100, 0)
