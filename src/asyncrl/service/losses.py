"""The Tinker client's built-in losses, each one a call of the project's :func:`asyncrl.algo.losses.policy_loss`.

Tinker's losses are per-token and summed (no mean: the client scales its advantages and weights
itself); every position of ``model_input`` is a loss position (position ``i`` predicts
``target_tokens[i]``; a zero weight or advantage takes a token out). With ``logp`` the current
log-prob of the target token, ``q`` the sampler's (``loss_fn_inputs["logprobs"]``) and ``A`` the
advantage:

==================== ================================================ ==========================================
client name           Tinker's definition                              here: ``policy_loss(...)``
==================== ================================================ ==========================================
``cross_entropy``     ``-sum(weights · logp)``                         ``loss_type="pg"``, advantages = weights,
                                                                       proximal = behaviour = ``logp`` detached
``importance_sampling`` ``-sum(exp(logp - q) · A)``                    ``loss_type="ppo"`` with no clip
                                                                       (``eps_clip = inf``), proximal = behaviour = q
``ppo``               ``-sum(min(r·A, clip(r, lo, hi)·A))``, r =       ``loss_type="ppo"``, ``eps_clip = 1 - lo``,
                      ``exp(logp - q)``, lo/hi ``clip_low_threshold``/   ``eps_clip_high = hi - 1``
                      ``clip_high_threshold`` (0.8 / 1.2)
``cispo``             ``-sum(sg(clip(r, lo, hi)) · A · logp)``          ``loss_type="cispo"``, same thresholds
==================== ================================================ ==========================================

All of them aggregate as a plain sum (``aggregation="token_mean"`` with ``denominator=1``), with no
behaviour-weight cap (``behav_cap=None``: proximal and behaviour policy are the same, so the weight is 1).
Any other name (``dro``, ``gspo``, ``stable_reinforce``, ``custom``) and any unknown config key is
refused with a ``ValueError`` naming it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from asyncrl.algo.losses import policy_loss

__all__ = ["LOSSES", "LossSpec", "check_loss", "tinker_loss"]


@dataclass(frozen=True)
class LossSpec:
    """What one client loss needs: its ``loss_fn_inputs`` and the config keys it takes (with defaults)."""

    inputs: tuple[str, ...]
    config: Mapping[str, float]


_CLIPS = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
LOSSES: dict[str, LossSpec] = {
    "cross_entropy": LossSpec(("target_tokens", "weights"), {}),
    "importance_sampling": LossSpec(("target_tokens", "logprobs", "advantages"), {}),
    "ppo": LossSpec(("target_tokens", "logprobs", "advantages"), _CLIPS),
    "cispo": LossSpec(("target_tokens", "logprobs", "advantages"), _CLIPS),
}
"""The supported client losses (the names of ``tinker.types.LossFnType`` this service computes)."""


def check_loss(loss_fn: str, config: Mapping[str, float | str], inputs: set[str]) -> dict[str, float]:
    """The loss's config with its defaults filled in; ``ValueError`` naming an unsupported loss, an
    unknown or non-numeric config key, or a missing/extra ``loss_fn_inputs`` name."""
    spec = LOSSES.get(loss_fn)
    if spec is None:
        raise ValueError(f"loss_fn {loss_fn!r} is not supported here (supported: {', '.join(LOSSES)})")
    out = dict(spec.config)
    for key, value in config.items():
        if key not in spec.config:
            raise ValueError(
                f"loss_fn_config key {key!r} is not supported for {loss_fn!r} (known: {list(spec.config)})"
            )
        if not isinstance(value, float | int) or not math.isfinite(float(value)):
            raise ValueError(f"loss_fn_config[{key!r}] must be a finite number, got {value!r}")
        out[key] = float(value)
    missing = [name for name in spec.inputs if name not in inputs]
    extra = sorted(inputs - set(spec.inputs))
    if missing:
        raise ValueError(f"loss_fn {loss_fn!r} needs loss_fn_inputs {missing}")
    if extra:
        raise ValueError(f"loss_fn_inputs {extra} are not used by {loss_fn!r} (it takes {list(spec.inputs)})")
    if "clip_low_threshold" in out and not 0.0 <= out["clip_low_threshold"] <= 1.0 <= out["clip_high_threshold"]:
        raise ValueError("need 0 <= clip_low_threshold <= 1 <= clip_high_threshold")
    return out


def tinker_loss(loss_fn: str, config: Mapping[str, float], logp: Tensor, inputs: Mapping[str, Tensor]) -> Tensor:
    """The summed loss of one datum (``logp``: the target tokens' current log-probs, ``[T]``)."""
    ones = torch.ones_like(logp)
    row = logp.unsqueeze(0)
    common = dict(behav_cap=None, aggregation="token_mean", denominator=1.0)
    match loss_fn:
        case "cross_entropy":
            weights = inputs["weights"].to(logp.dtype).unsqueeze(0)
            loss, _ = policy_loss(row, row.detach(), row.detach(), weights, ones.unsqueeze(0), loss_type="pg", **common)
        case "importance_sampling" | "ppo" | "cispo":
            q = inputs["logprobs"].to(logp.dtype).unsqueeze(0)
            adv = inputs["advantages"].to(logp.dtype).unsqueeze(0)
            if loss_fn == "importance_sampling":
                clips = dict(eps_clip=math.inf)
            else:
                clips = dict(
                    eps_clip=1.0 - config["clip_low_threshold"], eps_clip_high=config["clip_high_threshold"] - 1.0
                )
            loss_type = "cispo" if loss_fn == "cispo" else "ppo"
            loss, _ = policy_loss(row, q, q, adv, ones.unsqueeze(0), loss_type=loss_type, **clips, **common)
        case _:
            raise ValueError(f"loss_fn {loss_fn!r} is not supported here (supported: {', '.join(LOSSES)})")
    return loss
