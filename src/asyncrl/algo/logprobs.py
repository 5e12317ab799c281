"""Per-token log-prob utilities: KL penalties, entropy, and the log-linear proximal approximation.

This module owns :func:`kl_penalty` (k1/k2/k3 estimators of the KL to a reference model),
:func:`entropy_from_logits` (a chunked, metric-only entropy) and :func:`loglinear_prox_logp`
(AReaL's approximation of the proximal log-probs from stored per-token versions, which skips
the proximal forward pass). All are re-exported by :mod:`asyncrl.algo.losses`.

Version convention (DESIGN §7): version v is the policy published after v training steps;
training step i starts from version i and publishes version i + 1. The *proximal* policy of
step i is the weights at the start of the step, i.e. version i; the weights being optimised
during step i are the ones that will become version i + 1.
"""

from __future__ import annotations

import torch
from torch import Tensor

from asyncrl.choices import KLEstimator, choice_error

_ENTROPY_CHUNK_ELEMENTS = 1 << 24  # ~64 MB of float32 per temporary


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: KLEstimator) -> Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from sampled-token log-probs (Schulman's k1/k2/k3).

    With ``d = logp - ref_logp``:
    - ``"k1"``: ``d`` (unbiased, can be negative);
    - ``"k2"``: ``0.5 · d²``;
    - ``"k3"``: ``exp(-d) + d - 1`` = ``exp(ref - logp) - (ref - logp) - 1`` (unbiased, >= 0),
      computed with ``expm1`` for accuracy near 0.

    The gradient flows through ``logp``; ``ref_logp`` is detached. Mask and aggregate the result
    with :func:`asyncrl.algo.aggregation.aggregate_loss`.
    """
    if logp.shape != ref_logp.shape:
        raise ValueError(f"ref_logp shape {tuple(ref_logp.shape)} != logp shape {tuple(logp.shape)}")
    d = logp - ref_logp.detach()
    match kind:
        case "k1":
            return d
        case "k2":
            return 0.5 * d.square()
        case "k3":
            return torch.expm1(-d) + d
        case _:
            raise choice_error(kind, KLEstimator, "KL estimator")


@torch.no_grad()
def entropy_from_logits(logits: Tensor, *, chunk_rows: int | None = None) -> Tensor:
    """Entropy of ``softmax(logits)`` per position: ``[..., V] -> [...]`` (a metric: no gradient).

    Memory-aware: positions are processed in chunks of ``chunk_rows`` rows (default: about 16M
    vocabulary entries per chunk), so the temporaries never exceed a few chunk-sized buffers, no
    matter how long the batch; a non-contiguous input (``logits[:, :-1]``) is walked slice by
    slice along its first dimension instead of being copied whole. Computed in float32 (float64
    stays float64); logits of -inf (masked vocabulary entries) are allowed and contribute 0.
    """
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits need a non-empty vocabulary dimension, got shape {tuple(logits.shape)}")
    vocab = logits.shape[-1]
    rows = chunk_rows if chunk_rows is not None else max(1, _ENTROPY_CHUNK_ELEMENTS // vocab)
    if rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    dtype = torch.promote_types(logits.dtype, torch.float32)
    if logits.dim() <= 2:
        flat = logits.detach().reshape(-1, vocab) if logits.dim() == 1 else logits.detach()
    else:
        try:
            flat = logits.detach().view(-1, vocab)
        except RuntimeError:  # e.g. logits[:, :-1]: walk the first dim rather than copy everything
            return torch.stack([entropy_from_logits(x, chunk_rows=rows) for x in logits.unbind(0)])
    out = torch.empty(flat.shape[0], dtype=dtype, device=logits.device)
    finite_min = torch.finfo(dtype).min
    for start in range(0, flat.shape[0], rows):
        logp = torch.log_softmax(flat[start : start + rows].to(dtype), dim=-1)
        p = logp.exp()
        logp.clamp_(min=finite_min)  # p == 0 where logp == -inf: 0 · finite = 0, not NaN
        out[start : start + rows] = -(p.mul_(logp)).sum(dim=-1)
    return out.reshape(logits.shape[:-1])


@torch.no_grad()
def loglinear_prox_logp(
    behav_logp: Tensor,
    logp: Tensor,
    versions: Tensor,
    current_version: int,
    loss_mask: Tensor | None = None,
) -> Tensor:
    """AReaL's log-linear approximation of the proximal log-probs (skips the proximal forward).

    ``log π_prox ≈ log π_behav + α · (log π_θ - log π_behav)`` per token, with
    ``α = (v_θ - 1 - v_behav) / (v_θ - v_behav)``, where ``v_behav = versions`` (the version that
    sampled the token) and ``v_θ = current_version``.

    Convention: ``current_version`` is v_θ, the version the weights being optimised will be
    published as, i.e. ``current_version = i + 1`` during training step i (= ``TrainBatch.version
    + 1``). The proximal policy is version ``v_θ - 1 = i``, the weights at the start of the step
    (DESIGN §7). Hence a token sampled by the proximal version itself (``v_behav = i``) gets
    α = 0 and ``prox = behav`` exactly; older tokens get α = k/(k+1) for ``k = i - v_behav``
    steps of staleness (α → 1 as the sample ages).

    Tokens with ``version < 0`` (prompt/padding, the ``TrainSample`` convention) or, when given,
    ``loss_mask == 0`` are not approximated: the result there is ``behav_logp`` unchanged (and
    NaN/inf ``logp`` there does not leak). A loss token with ``version >= current_version`` is
    impossible under the convention (no such weights were published yet) and raises
    ``ValueError`` -- it almost always means ``current_version`` was passed as the step index i
    instead of i + 1.

    The result is detached (no gradient into the proximal log-probs, α included).
    """
    if not (behav_logp.shape == logp.shape == versions.shape):
        raise ValueError(
            f"behav_logp {tuple(behav_logp.shape)}, logp {tuple(logp.shape)} and versions "
            f"{tuple(versions.shape)} must have the same shape"
        )
    if versions.is_floating_point():
        raise ValueError("versions must be an integer tensor")
    valid = versions >= 0
    if loss_mask is not None:
        if loss_mask.shape != versions.shape:
            raise ValueError(f"loss_mask shape {tuple(loss_mask.shape)} != versions shape {tuple(versions.shape)}")
        valid = valid & (loss_mask != 0)
    if bool((valid & (versions >= current_version)).any()):
        newest = int(torch.where(valid, versions, -1).max())
        raise ValueError(
            f"a token has version {newest} >= current_version {current_version}: pass current_version = "
            "training step + 1 (the version this step publishes); the proximal policy is current_version - 1"
        )
    dtype = torch.promote_types(torch.promote_types(behav_logp.dtype, logp.dtype), torch.float32)
    behav = behav_logp.detach().to(dtype)
    cur = logp.detach().to(dtype)
    gap = (current_version - versions).clamp(min=1).to(dtype)  # v_θ - v_behav >= 1 where valid
    alpha = (gap - 1.0) / gap
    approx = behav + alpha * (cur - behav)
    return torch.where(valid & (alpha > 0), approx, behav)
