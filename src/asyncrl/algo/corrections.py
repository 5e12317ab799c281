"""Off-policy token masks for stale samples (DESIGN §5): which loss tokens to drop, as pure functions.

Each function maps per-token tensors to a boolean *keep* mask (True: the token stays in the loss)
plus, where useful, the statistics an ablation reports. The masks are meant for
:func:`asyncrl.algo.losses.policy_loss`'s ``drop`` argument (``drop = loss_mask & ~keep``): a dropped
token contributes nothing but stays in the loss denominator, like a ``mask``-mode behaviour cap,
so masking never up-weights the tokens that remain.

- :func:`version_gap_keep`: drop tokens whose behaviour version is more than ``max_gap`` versions
  behind the trainer's current version (token-level masking by staleness).
- :func:`m2_keep`: a second-moment trust region of the M2PO kind: drop the tokens with the largest
  squared log importance ratio until the second moment of what remains is at most ``tau``.

Sequence-level truncated / masked importance sampling lives in ``policy_loss`` itself
(``behav_cap_level="sequence"`` with ``behav_cap_mode="clamp"`` or ``"mask"``).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["m2_keep", "version_gap_keep"]


def version_gap_keep(versions: Tensor, current_version: int, max_gap: int, loss_mask: Tensor | None = None) -> Tensor:
    """Keep mask of token-level masking by version gap.

    A loss token sampled by version ``v`` at trainer version ``current_version`` (the proximal
    version i of training step i, DESIGN §7) has gap ``current_version - v``; it is kept when the
    gap is at most ``max_gap`` (``max_gap = 0`` keeps only on-policy tokens). Tokens with
    ``versions < 0`` (prompt, padding: the ``TrainSample`` convention) or ``loss_mask == 0`` are
    not loss tokens: the result there is True (nothing to drop). No gradient.
    """
    if versions.is_floating_point():
        raise ValueError("versions must be an integer tensor")
    if max_gap < 0:
        raise ValueError(f"max_gap must be >= 0, got {max_gap}")
    live = versions >= 0
    if loss_mask is not None:
        if loss_mask.shape != versions.shape:
            raise ValueError(f"loss_mask shape {tuple(loss_mask.shape)} != versions shape {tuple(versions.shape)}")
        live = live & (loss_mask != 0)
    return ~(live & (current_version - versions > max_gap))


@torch.no_grad()
def m2_keep(log_w: Tensor, loss_mask: Tensor, tau: float) -> tuple[Tensor, dict[str, float]]:
    """Keep mask of a second-moment trust region (M2PO) over one batch of tokens.

    M2PO (Zheng et al., 2025, "Prosperity before Collapse: How Far Can Off-Policy RL Reach with
    Stale Data on LLMs?", arXiv:2510.01161; as documented for AReaL's ``actor.m2_threshold``):
    with ``M2 = mean_t (log r_t)^2`` over the loss tokens of the batch, where ``log r_t`` is the
    log importance ratio of the policy at the start of the update against the behaviour policy,
    the tokens with the largest ``(log r_t)^2`` are masked, one at a time, until the second moment
    of the remaining tokens is at most ``tau``. Here ``log_w = log π_prox − log π_behav`` (the
    proximal policy is the one at the start of the step).

    Since the mean of the k smallest values grows with k, the kept set is the longest prefix of
    the values sorted ascending whose mean is ``<= tau`` (ties are broken by position, stably).
    A batch whose second moment is already ``<= tau`` keeps everything. Positions where
    ``loss_mask`` is 0 are True and ignored (NaN there does not matter).

    Returns ``(keep, stats)``: ``stats`` has ``m2_before`` and ``m2_after`` (second moment of
    ``log_w`` over the loss tokens, and over the kept ones) and ``m2_masked_frac`` (the share of
    loss tokens dropped); all 0.0 without loss tokens.

    The authors' code has variants (only tokens on the side PPO's clip would cut, i.e. A > 0 with
    r > 1 or A < 0 with r < 1, and a clip instead of a mask); this is the plain form above.
    """
    if log_w.shape != loss_mask.shape:
        raise ValueError(f"loss_mask shape {tuple(loss_mask.shape)} != log_w shape {tuple(log_w.shape)}")
    if not tau >= 0.0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    mask = (loss_mask != 0).reshape(-1)
    dtype = torch.promote_types(log_w.dtype, torch.float32)
    sq = log_w.detach().to(dtype).reshape(-1).square()
    idx = torch.nonzero(mask, as_tuple=False).squeeze(-1)
    keep = torch.ones_like(mask)
    n = int(idx.numel())
    if n == 0:
        return keep.reshape(log_w.shape), {"m2_before": 0.0, "m2_after": 0.0, "m2_masked_frac": 0.0}
    values = sq[idx]
    m2_before = float(values.mean())
    if m2_before <= tau:
        return keep.reshape(log_w.shape), {"m2_before": m2_before, "m2_after": m2_before, "m2_masked_frac": 0.0}
    sorted_values, order = torch.sort(values, stable=True)
    counts = torch.arange(1, n + 1, dtype=dtype, device=values.device)
    prefix_mean = torch.cumsum(sorted_values, 0) / counts
    kept = int((prefix_mean <= tau).sum())
    keep[idx[order[kept:]]] = False
    m2_after = float(prefix_mean[kept - 1]) if kept else 0.0
    stats = {"m2_before": m2_before, "m2_after": m2_after, "m2_masked_frac": (n - kept) / n}
    return keep.reshape(log_w.shape), stats
