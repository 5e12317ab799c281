"""The trainer's side of the off-policy token masks (``algo.max_version_gap``, ``algo.m2_threshold``).

The masks themselves are pure functions in :mod:`asyncrl.algo.corrections`; this module feeds them
the trainer's tensors:

- :func:`m2_keep_rows`: M2PO's mask over one whole PPO mini-batch (its second moment is a batch
  statistic, so it is computed before the mini-batch is split into micro-batches and ranks: the
  split stays invisible), as one bool row per sample;
- :func:`drop_mask`: per micro-batch, the loss tokens dropped by the version-gap mask and by the
  M2PO rows, with each mechanism's share of the micro-batch's loss tokens (the trainer's metrics
  ``version_gap_masked_frac`` and ``m2_masked_frac``, token-weighted over the step).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from asyncrl.algo.corrections import m2_keep, version_gap_keep
from asyncrl.types import TrainSample

__all__ = ["drop_mask", "m2_keep_rows"]


def m2_keep_rows(
    samples: Sequence[TrainSample],
    minibatch: Sequence[int],
    prox: dict[int, torch.Tensor] | None,
    tau: float | None,
    ctx: Any = None,
) -> tuple[dict[int, torch.Tensor], dict[str, float]] | None:
    """M2PO's keep mask over the mini-batch ``minibatch`` (indices into ``samples``), from the
    proximal log-probs ``prox`` (per sample index; under a process group ``ctx`` each rank holds
    its own share and they are gathered first, so every rank computes the same mask). Returns
    (sample index -> bool row aligned with its tokens, the mini-batch's ``m2_before`` /
    ``m2_after`` / ``m2_masked_frac``), or None when ``tau`` is None or there is no ``prox``."""
    if tau is None or prox is None:
        return None
    local = {i: prox[i] for i in minibatch if i in prox}
    if ctx is not None:
        local = {}
        for part in ctx.all_gather_object({i: prox[i].cpu() for i in minibatch if i in prox}):
            local.update(part)
    log_w = torch.cat(
        [local[i].float().cpu() - torch.tensor(samples[i].behav_logprobs, dtype=torch.float32) for i in minibatch]
    )
    mask = torch.cat([torch.tensor(samples[i].loss_mask) for i in minibatch])
    keep, stats = m2_keep(log_w, mask, tau)
    rows = torch.split(keep, [len(samples[i].token_ids) for i in minibatch])
    return dict(zip(minibatch, rows, strict=True)), stats


def drop_mask(
    micro: Any,
    rows: Sequence[TrainSample],
    keep_m2: list[torch.Tensor] | None,
    mask: torch.Tensor,
    version: int,
    max_version_gap: int | None,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The loss tokens of micro-batch ``micro`` (a packed or padded micro-batch of ``rows``) that the
    version-gap mask (trainer at ``version``) and the M2PO rows ``keep_m2`` drop, or None when both
    are off; and each mechanism's share of the micro-batch's loss tokens."""
    if max_version_gap is None and keep_m2 is None:  # the default: no work on the micro-batch loop
        return None, {}
    live = mask != 0
    n = float(live.sum().clamp(min=1))
    drop = torch.zeros_like(live)
    shares: dict[str, float] = {}
    if max_version_gap is not None:
        versions = micro.cat_rows([s.versions for s in rows], dtype=torch.long, fill=-1)
        gap = live & ~version_gap_keep(versions, version, max_version_gap, mask)
        shares["version_gap_masked_frac"] = float(gap.sum()) / n
        drop |= gap
    if keep_m2 is not None:
        m2 = live & (micro.cat_rows(keep_m2, fill=1.0) < 0.5)
        shares["m2_masked_frac"] = float(m2.sum()) / n
        drop |= m2
    return (drop if shares else None), shares
