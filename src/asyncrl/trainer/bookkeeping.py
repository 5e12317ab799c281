"""The trainer's bookkeeping: the loss denominator of a mini-batch, the LR schedule, and the
accumulation of a step's loss metrics over micro-batches and ranks.

- :func:`denominator`: the global normaliser of a mini-batch for an aggregation (DESIGN §5), so
  that micro-batch losses sum to the mini-batch's loss whatever the split;
- :func:`lr_factor`: linear warm-up then constant / linear / cosine decay, a function of the step
  index (the version), so a resume restores it by restoring the version;
- :class:`_Stats`: token-weighted sums and maxima of ``policy_loss``'s metrics.

Re-exported by :mod:`asyncrl.trainer.trainer`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from asyncrl.choices import Aggregation, LRSchedule, choice_error
from asyncrl.config import TrainerConfig
from asyncrl.types import TrainSample

__all__ = ["denominator", "lr_factor"]


def denominator(samples: Sequence[TrainSample], aggregation: Aggregation) -> float:
    """The global loss denominator of a mini-batch for ``aggregation`` (see ``algo.aggregation``)."""
    match aggregation:
        case "token_mean":
            return float(max(1, sum(s.num_loss_tokens for s in samples)))
        case "seq_mean_token_mean":
            return float(max(1, sum(1 for s in samples if s.num_loss_tokens > 0)))
        case "seq_mean_token_sum":
            return float(max(1, len(samples) * max(len(s.token_ids) for s in samples)))
        case _:
            raise choice_error(aggregation, Aggregation, "aggregation")


def lr_factor(step: int, cfg: TrainerConfig, total_steps: int | None) -> float:
    """LR multiplier of training step ``step``: linear warm-up over ``warmup_steps``, then the
    configured decay to ``min_lr_ratio`` over ``decay_steps`` (or ``total_steps``)."""
    warm = max(0, cfg.warmup_steps)
    if step < warm:
        return (step + 1) / warm
    horizon = cfg.decay_steps or total_steps or 0
    if cfg.lr_schedule == "constant" or horizon <= warm:
        return 1.0
    progress = min(1.0, (step - warm) / max(1, horizon - warm))
    floor = cfg.min_lr_ratio
    match cfg.lr_schedule:
        case "linear":
            return 1.0 - (1.0 - floor) * progress
        case "cosine":
            return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
        case other:
            raise choice_error(other, LRSchedule, "lr_schedule")


@dataclass
class _Stats:
    """Loss metrics of one step: token-weighted sums, maxima, micro-batch count."""

    sums: dict[str, float] = field(default_factory=dict)
    maxima: dict[str, float] = field(default_factory=dict)
    weight: float = 0.0
    micro_batches: int = 0

    @staticmethod
    def merge(parts: list[_Stats]) -> _Stats:
        """The statistics of several ranks together (micro-batch count: the per-rank count)."""
        out = _Stats(micro_batches=parts[0].micro_batches)
        for part in parts:
            out.weight += part.weight
            for k, v in part.sums.items():
                out.sums[k] = out.sums.get(k, 0.0) + v
            for k, v in part.maxima.items():
                out.maxima[k] = max(out.maxima.get(k, -math.inf), v)
        return out

    def add(self, metrics: dict[str, float]) -> None:
        w = metrics["n_loss_tokens"]
        self.weight += w
        for k, v in metrics.items():
            if k.endswith("_max"):
                self.maxima[k] = max(self.maxima.get(k, -math.inf), float(v))
            elif k != "n_loss_tokens":
                self.sums[k] = self.sums.get(k, 0.0) + w * float(v)
