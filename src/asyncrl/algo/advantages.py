"""Advantage estimators (DESIGN §5): pure tensor functions, no gradient anywhere.

This module owns the group-relative estimators over rewards ``[num_groups, G]`` (one row per
prompt, one column per sample): GRPO, Dr.GRPO, RLOO and the REINFORCE++ baseline, dispatched by
:func:`compute_advantages`; batch-level normalisation (:func:`normalize_batch`); GAE over
per-token rewards and critic values (:func:`gae_advantages`); and two small reward shapers that
the batcher uses, :func:`informative_groups` (dynamic sampling) and :func:`overlong_penalty`
(DAPO's soft length penalty). The critic's :func:`value_loss` lives in
:mod:`asyncrl.algo.losses` and is re-exported here.

Conventions: every standard deviation is the population one (``correction=0``, divide by n), so
a group of one sample has std 0 rather than NaN. A group whose rewards are all equal (G = 1
included) gets advantages exactly 0 (no NaN, no 1e-11 residue from float rounding).
"""

from __future__ import annotations

import torch
from torch import Tensor

from asyncrl.algo.losses import value_loss
from asyncrl.choices import AdvantageEstimator, choice_error

__all__ = [
    "grpo_advantages",
    "dr_grpo_advantages",
    "rloo_advantages",
    "reinforce_pp_advantages",
    "compute_advantages",
    "normalize_batch",
    "gae_advantages",
    "value_loss",
    "informative_groups",
    "overlong_penalty",
]


def _groups(rewards: Tensor) -> Tensor:
    """Validate ``[num_groups, G]`` rewards; detach and make floating point."""
    if rewards.dim() != 2 or rewards.shape[1] == 0:
        raise ValueError(f"rewards must be [num_groups, G] with G >= 1, got shape {tuple(rewards.shape)}")
    r = rewards.detach()
    return r if r.is_floating_point() else r.to(torch.get_default_dtype())


def _uniform(r: Tensor) -> Tensor:
    """``[num_groups, 1]`` bool: the group's rewards are all equal (no learning signal)."""
    return r.amax(dim=-1, keepdim=True) == r.amin(dim=-1, keepdim=True)


def _centered(r: Tensor) -> Tensor:
    """``r - group mean``, exactly 0 for groups whose rewards are all equal."""
    return torch.where(_uniform(r), 0.0, r - r.mean(dim=-1, keepdim=True))


def grpo_advantages(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """GRPO: ``A_i = (r_i - mean_g) / (std_g + eps)`` per group (row).

    ``std_g`` is the population std of the group (``correction=0``: divide by G, not G - 1).
    Groups with all-equal rewards (G = 1 included) get exactly 0, also with ``eps=0``.
    """
    r = _groups(rewards)
    std = r.std(dim=-1, correction=0, keepdim=True)
    return torch.where(_uniform(r), 0.0, (r - r.mean(dim=-1, keepdim=True)) / (std + eps))


def dr_grpo_advantages(rewards: Tensor) -> Tensor:
    """Dr.GRPO: ``A_i = r_i - mean_g`` (no std normalisation)."""
    return _centered(_groups(rewards))


def rloo_advantages(rewards: Tensor) -> Tensor:
    """RLOO: leave-one-out baseline ``A_i = r_i - mean_{j != i} r_j`` (= ``G/(G-1)·(r_i - mean_g)``).

    Needs G >= 2 (``ValueError`` otherwise: one sample has no other to compare with).
    """
    r = _groups(rewards)
    g = r.shape[1]
    if g < 2:
        raise ValueError(f"rloo_advantages needs at least 2 samples per group, got G={g}")
    return _centered(r) * (g / (g - 1))


def reinforce_pp_advantages(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """REINFORCE++ with a group baseline: ``c_i = r_i - mean_g`` per group, then
    ``A_i = c_i / (std_batch(c) + eps)``, where ``std_batch`` is the population std of all the
    centred values of the batch (every group, every sample; their batch mean is 0, so this is a
    whole-batch whitening). A batch whose groups are all uniform gets exactly 0.
    """
    c = _centered(_groups(rewards))
    if c.numel() == 0:
        return c
    std = c.std(correction=0)
    return torch.where(c == 0, 0.0, c / (std + eps))


def compute_advantages(rewards: Tensor, estimator: AdvantageEstimator, **kw: float) -> Tensor:
    """Dispatch to one group estimator (``AdvantageEstimator``, the type of ``algo.advantage``); ``kw``
    goes to it (e.g. ``eps``). GAE has its own signature (:func:`gae_advantages`)."""
    match estimator:
        case "grpo":
            return grpo_advantages(rewards, **kw)
        case "dr_grpo":
            return dr_grpo_advantages(rewards, **kw)
        case "rloo":
            return rloo_advantages(rewards, **kw)
        case "reinforce_pp":
            return reinforce_pp_advantages(rewards, **kw)
        case _:
            raise choice_error(estimator, AdvantageEstimator, "advantage estimator")


def normalize_batch(adv: Tensor, mask: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """Batch-level normalisation ``(A - mean) / (std + eps)`` (AReaL applies it after the group one).

    Mean and population std are taken over the entries where ``mask`` is nonzero (all entries
    when ``mask`` is None): with per-token advantages and a loss mask that is a token-level
    normalisation (longer responses weigh more); with ``[num_groups, G]`` advantages it is
    per sample. The result is 0 where ``mask`` is 0 (NaN there is ignored), and exactly 0
    everywhere if all masked entries are equal.
    """
    a = adv.detach()
    if not a.is_floating_point():
        a = a.to(torch.get_default_dtype())
    if mask is None:
        m = torch.ones_like(a, dtype=torch.bool)
    else:
        if mask.shape != a.shape:
            raise ValueError(f"mask shape {tuple(mask.shape)} != advantages shape {tuple(a.shape)}")
        m = mask != 0
    zero = torch.zeros((), dtype=a.dtype, device=a.device)
    x = torch.where(m, a, zero)
    n = m.sum().clamp(min=1)
    mean = x.sum() / n
    std = (torch.where(m, a - mean, zero).square().sum() / n).sqrt()
    if a.numel() == 0:
        return x
    uniform = torch.where(m, a, -torch.inf).amax() == torch.where(m, a, torch.inf).amin()
    return torch.where(m & ~uniform, (a - mean) / (std + eps), zero)


@torch.no_grad()
def gae_advantages(
    token_rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over ``[B, T]`` per-token rewards and critic values.

    ``mask`` is 1 on the response (action) tokens. Each row is one episode made of its masked
    positions, in order: positions where ``mask`` is 0 (prompt, padding, or tool output between
    turns) are skipped, not treated as time steps, and their rewards/values are ignored (NaN
    allowed). The episode ends after its last masked token (next value 0, no bootstrap). For
    consecutive masked steps t -> t':

        δ_t = r_t + γ·V_{t'} - V_t,    A_t = δ_t + γ·λ·A_{t'},    returns_t = A_t + V_t

    Put a sequence-level reward on the last response token. With γ = λ = 1 and zero values
    (AReaL's GRPO recipe without a critic) A_t is the sum of the rewards from t on.
    Returns ``(advantages, returns)``, both 0 where ``mask`` is 0; no gradient.
    """
    if token_rewards.dim() != 2 or values.shape != token_rewards.shape or mask.shape != token_rewards.shape:
        raise ValueError(
            f"token_rewards {tuple(token_rewards.shape)}, values {tuple(values.shape)} and mask "
            f"{tuple(mask.shape)} must all be the same [B, T] shape"
        )
    dtype = torch.promote_types(torch.promote_types(token_rewards.dtype, values.dtype), torch.float32)
    zero = torch.zeros((), dtype=dtype, device=values.device)
    m = mask != 0
    r = torch.where(m, token_rewards.to(dtype), zero)
    v = torch.where(m, values.to(dtype), zero)
    b, t_len = r.shape
    adv = torch.zeros_like(r)
    next_value = torch.zeros(b, dtype=dtype, device=r.device)
    next_adv = torch.zeros(b, dtype=dtype, device=r.device)
    for t in range(t_len - 1, -1, -1):
        mt = m[:, t]
        delta = r[:, t] + gamma * next_value - v[:, t]
        a_t = delta + (gamma * lam) * next_adv
        adv[:, t] = torch.where(mt, a_t, zero)
        next_value = torch.where(mt, v[:, t], next_value)
        next_adv = torch.where(mt, a_t, next_adv)
    returns = torch.where(m, adv + v, zero)
    return adv, returns


def informative_groups(rewards: Tensor) -> Tensor:
    """Dynamic sampling (DAPO): ``[num_groups]`` bool, True for groups whose rewards are not all
    equal. Uniform groups (all correct, all wrong, G = 1) give zero group-relative advantage."""
    return ~_uniform(_groups(rewards)).squeeze(-1)


def overlong_penalty(lengths: Tensor, max_length: int, buffer_length: int, penalty: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment, added to the reward, per response length L:

    ``0`` if ``L <= max_length - buffer_length``; ``-penalty · (L - (max_length - buffer_length))
    / buffer_length`` inside the buffer (linear from 0 to ``-penalty`` at ``L = max_length``);
    ``-penalty`` beyond ``max_length``.
    """
    if not 0 < buffer_length <= max_length:
        raise ValueError(f"need 0 < buffer_length <= max_length, got {buffer_length}, {max_length}")
    length = lengths.detach().to(torch.promote_types(lengths.dtype, torch.get_default_dtype()))
    start = max_length - buffer_length
    inside = -penalty * (length - start) / buffer_length
    return torch.where(length <= start, 0.0, torch.where(length <= max_length, inside, -penalty))
