"""Policy and value losses (DESIGN §5): the decoupled PPO objective and its variants.

This module owns :func:`policy_loss` (decoupled PPO, GSPO, CISPO, the uncorrected policy
gradient; the behaviour weight, capped, uncapped or left out; externally chosen token drops
(:mod:`asyncrl.algo.corrections`); dual clip; explicit aggregation with a global denominator) and
:func:`value_loss` (the clipped critic loss). Per-token log-prob utilities live in :mod:`asyncrl.algo.logprobs` and are
re-exported here (:func:`kl_penalty`, :func:`entropy_from_logits`, :func:`loglinear_prox_logp`),
aggregation in :mod:`asyncrl.algo.aggregation` (:func:`aggregate_loss`).

Naming (never "old"): ``logp`` are the *current* log-probs of the weights being optimised (the
only input with a gradient), ``prox_logp`` the *proximal* ones (weights at the start of the
training step), ``behav_logp`` the *behaviour* ones (the engine's, when the token was sampled).
All of them are the log-probs of the sampled tokens, ``[B, T]`` with ``loss_mask`` 0/1 (or a
packed row with ``cu_seqlens``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from asyncrl.algo.aggregation import Segments, aggregate, aggregate_loss, check_denominator
from asyncrl.algo.logprobs import entropy_from_logits, kl_penalty, loglinear_prox_logp
from asyncrl.choices import Aggregation, BehavCapLevel, BehavCapMode, LossType, check_choice, choice_error

__all__ = [
    "policy_loss",
    "value_loss",
    "aggregate_loss",
    "kl_penalty",
    "entropy_from_logits",
    "loglinear_prox_logp",
]


def _float_dtype(t: Tensor) -> torch.dtype:
    """Compute in at least float32 (half/bf16 inputs are upcast), float64 stays float64."""
    return torch.promote_types(t.dtype, torch.float32)


def _clipped_surrogate(
    ratio: Tensor, adv: Tensor, low: float, high: float, dual_clip: float | None
) -> tuple[Tensor, Tensor, Tensor]:
    """PPO's pessimistic per-token term ``max(-r·A, -clip(r)·A)``, with the optional dual clip
    ``min(., -c·A)`` for A < 0. Returns (term, clip_active, dual_clip_active)."""
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(low, high)
    term = torch.maximum(unclipped, clipped)
    clip_active = (clipped > unclipped).detach()
    dual_active = torch.zeros_like(clip_active)
    if dual_clip is not None:
        bound = -dual_clip * adv
        negative = adv < 0
        dual_active = (negative & (term > bound)).detach()
        term = torch.where(negative, torch.minimum(term, bound), term)
    return term, clip_active, dual_active


def _behaviour_weight(
    log_w: Tensor, mask: Tensor, cap: float | None, mode: BehavCapMode, level: BehavCapLevel, segments: Segments | None
) -> tuple[Tensor, Tensor, Tensor]:
    """Behaviour weight per token from ``log_w = prox - behav`` (zero off the mask, detached).

    Returns (weight, dropped, capped): ``dropped`` tokens contribute nothing (but stay in the
    denominator); ``capped`` marks the loss tokens the cap acted on (dropped or clamped)."""
    none = torch.zeros_like(mask)
    if cap is None:
        return log_w.exp(), none, none
    log_cap = math.log(cap)
    if level == "token":
        over = mask & (log_w > log_cap)
        if mode == "mask":
            return torch.where(over, 0.0, log_w).exp(), over, over
        return log_w.clamp(max=log_cap).exp(), none, over
    assert segments is not None
    n_tok = segments.sum(mask.to(log_w.dtype)).clamp(min=1)
    seq_log_w = segments.sum(log_w) / n_tok  # log of the geometric mean over the loss tokens
    over = mask & segments.expand(seq_log_w > log_cap)
    if mode == "mask":
        return torch.where(over, 0.0, log_w).exp(), over, over
    return segments.expand(seq_log_w.clamp(max=log_cap).exp()), none, over


def policy_loss(
    logp: Tensor,
    prox_logp: Tensor,
    behav_logp: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    dual_clip: float | None = None,
    behav_cap: float | None,
    behav_weight: bool = True,
    behav_cap_mode: BehavCapMode = "mask",
    behav_cap_level: BehavCapLevel = "token",
    aggregation: Aggregation = "token_mean",
    loss_type: LossType = "ppo",
    denominator: float | Tensor | None = None,
    cu_seqlens: Tensor | None = None,
    drop: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The decoupled policy loss (DESIGN §5). Returns ``(loss, metrics)``.

    Inputs are ``[B, T]`` (one sequence per row, right padding allowed) with ``loss_mask`` 0/1;
    ``advantages`` may also be ``[B, 1]`` (broadcast). With ``cu_seqlens`` the inputs are one
    packed row ``[N]`` / ``[1, N]`` and sequences are its ``cu_seqlens`` runs. ``loss`` is a scalar
    whose gradient flows through ``logp`` only (``prox_logp``, ``behav_logp`` and ``advantages``
    are detached). Positions where ``loss_mask`` is 0 are ignored entirely: NaN/inf there poison
    neither the loss nor its gradient. Half-precision inputs are computed in float32.

    Per loss token t (``r = exp(logp - prox_logp)``, ``w = exp(prox_logp - behav_logp)``,
    ``clip(x) = clamp(x, 1 - eps_clip, 1 + eps_high)``, ``eps_high = eps_clip_high or eps_clip``):

    - ``loss_type="ppo"``: ``term = max(-r·A, -clip(r)·A)``; ``loss_t = w · term``.
      Standard PPO is ``prox_logp = behav_logp`` (then w ≡ 1).
    - ``loss_type="gspo"`` (GSPO, plain sequence form with full gradient): the ratio of every
      token of sequence i is the sequence ratio ``s_i = exp(mean_t(logp - prox_logp))`` over the
      sequence's loss tokens; ``term = max(-s_i·A_t, -clip(s_i)·A_t)``, ``loss_t = w · term``.
      The gradient flows into every token of the sequence through ``s_i`` (no stop-gradient
      trick). With one advantage per sequence and ``aggregation="seq_mean_token_mean"`` this is
      exactly the GSPO paper's objective (and then equals its GSPO-token form in value and
      gradient). GSPO needs a much smaller ``eps_clip`` than PPO (the paper: 3e-4 / 4e-4).
    - ``loss_type="cispo"`` (CISPO): ``loss_t = -sg(clip(r)) · w · A · logp`` -- the clipped
      importance weight is a constant, so the gradient is ``-clip(r)·w·A·∇logp`` everywhere (no
      token is ever cut off). Both bounds apply: ``[1 - eps_clip, 1 + eps_high]``; pass
      ``eps_clip >= 1`` for the paper's setting with no lower bound. ``dual_clip`` is rejected.
      The loss *value* is a surrogate (it depends on logp itself); its gradient is what counts.

    - ``loss_type="pg"`` (the plain policy gradient, no correction): ``loss_t = -w · A · logp``,
      no ratio and no clip (``eps_clip`` is ignored, ``dual_clip`` rejected). With
      ``prox_logp = behav_logp`` (w ≡ 1) this is REINFORCE on the samples as they are, stale or
      not: the gradient is ``-A·∇logp``; on fresh samples it equals PPO's first-update gradient.

    ``dual_clip=c`` (c > 1, ppo/gspo): for A < 0 the term is ``min(max(-r·A, -clip(r)·A), -c·A)``.

    Behaviour weight ``w`` (never silently dropped: with ``behav_cap=None`` it is applied
    uncapped; ``behav_cap`` has no default, so every caller says which: a run passes
    ``algo.behav_cap``). ``behav_weight=False`` leaves it out on purpose: ``loss_t = term`` (w ≡ 1),
    a clip around π_prox only (AReaL with ``rejection_sampling=None``); ``behav_cap`` must then be
    None (a cap acts on the weight). ``behav_cap=C`` with ``behav_cap_mode`` / ``behav_cap_level``:

    - ``mask``/``token``: tokens with ``w > C`` contribute 0.
    - ``mask``/``sequence``: sequences whose geometric-mean weight
      ``exp(mean_t(prox_logp - behav_logp))`` over their loss tokens exceeds C contribute 0; the
      other sequences keep their per-token ``w``.
    - ``clamp``/``token``: ``w_t -> min(w_t, C)``.
    - ``clamp``/``sequence``: every token of sequence i uses the sequence weight
      ``min(geomean_i(w), C)`` (sequence-level truncated importance sampling) instead of its own
      ``w_t``.

    ``drop`` (optional bool, same shape): loss tokens dropped by a mask chosen outside (version
    gap, M2PO: :mod:`asyncrl.algo.corrections`); they contribute 0, like cap-masked ones.

    Dropped tokens stay in the denominator (masking never up-weights the rest).

    ``aggregation`` / ``denominator``: see :func:`asyncrl.algo.aggregation.aggregate_loss` (pass
    the global denominator when micro-batching; then the micro-batch losses sum to the global
    loss exactly; sequence-level quantities need whole sequences in a micro-batch).

    ``metrics`` (floats, over this call's loss tokens; 0.0 when there are none):
    ``n_loss_tokens``, ``clip_frac`` (tokens where the clipped branch is the active one; for
    CISPO where the weight was clipped), ``dual_clip_frac``, ``ratio_mean`` (of r, or s_i for
    GSPO), ``behav_weight_mean`` / ``behav_weight_max`` (of the raw w, before any cap),
    ``behav_capped_frac`` (tokens dropped or clamped by the cap), ``behav_weight_sq_mean`` (second
    moment of the raw w), ``log_behav_weight_sq_mean`` (mean of ``(log w)²``, M2PO's statistic),
    ``dropped_frac`` (tokens dropped by ``drop``), ``approx_kl_prox`` /
    ``approx_kl_behav`` (k3 estimates ``(ρ - 1) - log ρ`` with ``ρ = π_θ/π_prox`` resp.
    ``π_θ/π_behav``, token means). After the cap, what the gradient sees (over the same loss
    tokens, the *applied* weight ``a_t`` being the weight that multiplies token t's term: the
    clamped w, 1 with ``behav_weight=False``, and 0 for a token dropped by the cap or ``drop``):
    ``applied_weight_mean``, ``applied_weight_sq_mean`` (E[a²], beside the raw E[w²]),
    ``applied_weight_max``, and ``applied_clip_frac`` (tokens that still contribute and whose
    clipped branch is active).
    """
    shape = logp.shape
    for name, t in (("prox_logp", prox_logp), ("behav_logp", behav_logp), ("loss_mask", loss_mask)):
        if t.shape != shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != logp shape {tuple(shape)}")
    try:
        adv_ok = torch.broadcast_shapes(advantages.shape, shape) == shape
    except RuntimeError:
        adv_ok = False
    if not adv_ok:
        raise ValueError(f"advantages shape {tuple(advantages.shape)} does not broadcast to {tuple(shape)}")
    check_choice(aggregation, Aggregation, "aggregation")
    check_choice(behav_cap_mode, BehavCapMode, "behav_cap_mode")
    check_choice(behav_cap_level, BehavCapLevel, "behav_cap_level")
    eps_high = eps_clip if eps_clip_high is None else eps_clip_high
    if not (eps_clip >= 0 and eps_high >= 0):
        raise ValueError(f"eps_clip ({eps_clip}) and eps_clip_high ({eps_clip_high}) must be >= 0")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    if dual_clip is not None and loss_type in ("cispo", "pg"):
        raise ValueError(f"dual_clip does not apply to loss_type={loss_type!r} (it never cuts gradients)")
    if drop is not None and drop.shape != shape:
        raise ValueError(f"drop shape {tuple(drop.shape)} != logp shape {tuple(shape)}")
    if behav_cap is not None and not behav_cap > 0.0:
        raise ValueError(f"behav_cap must be > 0, got {behav_cap}")
    if not behav_weight and behav_cap is not None:
        raise ValueError("behav_cap acts on the behaviour weight: with behav_weight=False pass behav_cap=None")
    check_denominator(denominator)

    dtype = _float_dtype(logp)
    device = logp.device
    zero = torch.zeros((), dtype=dtype, device=device)
    mask = loss_mask != 0
    # Sanitise with torch.where (not multiplication): masked NaN/inf never reach exp or backward.
    lp = torch.where(mask, logp.to(dtype), zero)
    prox = torch.where(mask, prox_logp.detach().to(dtype), zero)
    behav = torch.where(mask, behav_logp.detach().to(dtype), zero)
    adv = torch.where(mask, advantages.detach().to(dtype), zero)

    needs_segments = (
        cu_seqlens is not None
        or loss_type == "gspo"
        or aggregation != "token_mean"
        or (behav_weight and behav_cap is not None and behav_cap_level == "sequence")
    )
    segments = Segments(shape, device, cu_seqlens) if needs_segments else None

    low, high = 1.0 - eps_clip, 1.0 + eps_high
    log_ratio = lp - prox
    dual_active = torch.zeros_like(mask)
    match loss_type:
        case "ppo":
            ratio = log_ratio.exp()
            term, clip_active, dual_active = _clipped_surrogate(ratio, adv, low, high, dual_clip)
        case "gspo":
            assert segments is not None
            n_tok = segments.sum(mask.to(dtype)).clamp(min=1)
            ratio = segments.expand((segments.sum(log_ratio) / n_tok).exp())
            term, clip_active, dual_active = _clipped_surrogate(ratio, adv, low, high, dual_clip)
        case "cispo":
            ratio = log_ratio.exp()
            r = ratio.detach()
            term = -r.clamp(low, high) * adv * lp
            clip_active = (r < low) | (r > high)
        case "pg":
            ratio = log_ratio.exp()
            term = -adv * lp
            clip_active = torch.zeros_like(mask)
        case _:
            raise choice_error(loss_type, LossType, "loss_type")

    log_w = prox - behav
    if behav_weight:
        weight, dropped, capped = _behaviour_weight(log_w, mask, behav_cap, behav_cap_mode, behav_cap_level, segments)
    else:
        weight, dropped, capped = torch.ones_like(log_w), torch.zeros_like(mask), torch.zeros_like(mask)
    external = mask & drop.to(torch.bool) if drop is not None else torch.zeros_like(mask)
    keep = mask & ~dropped & ~external
    per_token = torch.where(keep, weight * term, zero)
    loss = aggregate(per_token, mask, aggregation, denominator, segments)

    with torch.no_grad():
        n = mask.sum()
        n_f = n.clamp(min=1).to(dtype)

        def mean(x: Tensor) -> Tensor:
            return torch.where(mask, x.to(dtype), zero).sum() / n_f

        def largest(x: Tensor) -> Tensor:
            return torch.where(mask, x, zero).amax() if x.numel() else zero

        raw_w = log_w.exp()
        applied = torch.where(keep, weight.detach(), zero)
        rho = lp.detach() - behav
        stats = [
            n.to(dtype),
            mean(clip_active),
            mean(dual_active),
            mean(ratio.detach()),
            mean(raw_w),
            largest(raw_w),
            mean(capped),
            mean(torch.expm1(log_ratio.detach()) - log_ratio.detach()),
            mean(torch.expm1(rho) - rho),
            mean(raw_w.square()),
            mean(log_w.square()),
            mean(external),
            mean(applied),
            mean(applied.square()),
            largest(applied),
            mean(keep & clip_active),
        ]
        values = torch.stack(stats).tolist()
    keys = (
        "n_loss_tokens",
        "clip_frac",
        "dual_clip_frac",
        "ratio_mean",
        "behav_weight_mean",
        "behav_weight_max",
        "behav_capped_frac",
        "approx_kl_prox",
        "approx_kl_behav",
        "behav_weight_sq_mean",
        "log_behav_weight_sq_mean",
        "dropped_frac",
        "applied_weight_mean",
        "applied_weight_sq_mean",
        "applied_weight_max",
        "applied_clip_frac",
    )
    return loss, dict(zip(keys, values, strict=True))


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None = 0.2,
    *,
    denominator: float | Tensor | None = None,
) -> Tensor:
    """Clipped critic loss (PPO), token mean over ``mask``.

    Per token: ``0.5 · max((V - R)², (V_clip - R)²)`` with
    ``V_clip = V_old + clamp(V - V_old, -clip, clip)``; ``clip=None`` gives ``0.5 · (V - R)²``.
    ``values`` carries the gradient; ``old_values`` (the critic's values when the returns were
    computed) and ``returns`` are detached. Masked positions are ignored (NaN-safe).
    ``denominator`` as in :func:`aggregate_loss` (global loss-token count when micro-batching).
    """
    for name, t in (("old_values", old_values), ("returns", returns), ("mask", mask)):
        if t.shape != values.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != values shape {tuple(values.shape)}")
    if clip is not None and not clip >= 0:
        raise ValueError(f"clip must be >= 0 or None, got {clip}")
    dtype = _float_dtype(values)
    zero = torch.zeros((), dtype=dtype, device=values.device)
    m = mask != 0
    v = torch.where(m, values.to(dtype), zero)
    old = torch.where(m, old_values.detach().to(dtype), zero)
    ret = torch.where(m, returns.detach().to(dtype), zero)
    err = (v - ret).square()
    if clip is not None:
        v_clip = old + (v - old).clamp(-clip, clip)
        err = torch.maximum(err, (v_clip - ret).square())
    return aggregate(0.5 * err, m, "token_mean", denominator, None)
