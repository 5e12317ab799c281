"""Synthetic training batches for trainer tests: long-tailed lengths, off-policy behaviour log-probs."""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from asyncrl.types import TrainSample


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| (0 when both are zero)."""
    denom = float(b.norm())
    num = float((a - b).norm())
    return num / denom if denom > 0 else num


def make_samples(
    n: int,
    *,
    seed: int = 0,
    version: int = 0,
    lengths: Sequence[int] | None = None,
    vocab: tuple[int, int] = (4, 90),
    logprob_fn=None,
    noise: float = 0.3,
) -> list[TrainSample]:
    """``n`` samples: a short prompt (no loss) then a response (loss tokens) of long-tailed length.

    Behaviour log-probs are ``logprob_fn(samples)`` (e.g. a trainer's current log-probs) plus
    Gaussian noise, so behaviour weights differ from 1 and some ratios clip; without
    ``logprob_fn`` they are random negatives. Versions are 0..version (stale tokens)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    drafts = []
    for i in range(n):
        prompt_len = rng.randint(2, 6)
        resp_len = lengths[i] if lengths is not None else rng.choice([3, 5, 8, 12, 20, 40])
        ids = torch.randint(vocab[0], vocab[1], (prompt_len + resp_len,), generator=gen).tolist()
        mask = [0] * prompt_len + [1] * resp_len
        adv = rng.uniform(-1.5, 1.5)
        drafts.append((ids, mask, adv))
    base: list[list[float]]
    if logprob_fn is not None:
        probes = [
            _sample(f"p{i}", ids, m, [0.0] * len(ids), 0.0, [0] * len(ids)) for i, (ids, m, _) in enumerate(drafts)
        ]
        base = [t.tolist() for t in logprob_fn(probes)]
    else:
        base = [[-rng.uniform(0.5, 4.0) for _ in ids] for ids, _, _ in drafts]
    out = []
    for i, (ids, mask, adv) in enumerate(drafts):
        behav = [(b + rng.gauss(0.0, noise)) if m else 0.0 for b, m in zip(base[i], mask, strict=True)]
        versions = [rng.randint(0, version) if m else -1 for m in mask]
        out.append(_sample(f"p{i}", ids, mask, behav, adv, versions))
    return out


def _sample(pid: str, ids, mask, behav, adv: float, versions) -> TrainSample:
    live = [v for v, m in zip(versions, mask, strict=True) if m]
    return TrainSample(
        prompt_id=pid,
        sample_idx=0,
        token_ids=tuple(ids),
        loss_mask=tuple(mask),
        behav_logprobs=tuple(behav),
        advantages=tuple(adv if m else 0.0 for m in mask),
        versions=tuple(versions),
        min_version=min(live) if live else 0,
        max_version=max(live) if live else 0,
    )
