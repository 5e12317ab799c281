"""The buffer of finished prompt groups and the batcher that turns them into train samples.

- ``GroupBuffer``: FIFO of accepted groups, in the order they finished. ``take_fresh`` at
  training step i takes the oldest ``batch_size`` groups whose samples obey the staleness bound
  (``i - min_version <= max_staleness``, or the group's own lower bound: with
  ``controller.adaptive`` each group is put with the η in force when it was admitted), or none
  while fewer are buffered, and removes (and returns, for the ledger) the older ones; with
  ``controller.stragglers=wait`` it takes the groups nearest their bound first; ``last_steps``
  gives each buffered group's last trainable step for the wait rule.
- ``groups_to_samples``: groups into ``TrainSample``s with per-token advantages from the group
  estimator of ``algo`` (rewards scaled and biased first, then DAPO's overlong penalty added when
  ``algo.overlong_buffer > 0``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch

from asyncrl.algo.advantages import compute_advantages, normalize_batch, overlong_penalty
from asyncrl.config import AlgoConfig
from asyncrl.controller.staleness import group_bound
from asyncrl.types import Group, TrainSample


class GroupBuffer:
    """Accepted groups waiting to be trained (oldest first)."""

    def __init__(self) -> None:
        self._groups: deque[tuple[Group, int | None]] = deque()

    def __len__(self) -> int:
        return len(self._groups)

    def put(self, group: Group, max_staleness: int | None = None) -> None:
        """Buffer ``group``; ``max_staleness``: its own bound (the η in force when it was admitted),
        None: only the bound ``take_fresh`` is given."""
        self._groups.append((group, max_staleness))

    def last_steps(self, max_staleness: int) -> list[int]:
        """The last step that may train each buffered group (``min_version`` + its bound)."""
        return [g.min_version + group_bound(own, max_staleness) for g, own in self._groups]

    def drain(self) -> list[Group]:
        """Remove and return everything (shutdown / checkpoint)."""
        out = [g for g, _ in self._groups]
        self._groups.clear()
        return out

    def take_fresh(
        self, step: int, max_staleness: int, count: int, *, nearest_bound_first: bool = False
    ) -> tuple[list[Group], list[Group]]:
        """``(batch, stale)``: the ``count`` oldest groups fresh enough for training step ``step``,
        removed, or ``[]`` while fewer are buffered (they stay, in order); and every stale group
        (``step - min_version`` above ``max_staleness`` or above its own bound), removed: the caller
        records them as dropped. ``nearest_bound_first``: the batch takes the groups whose last
        trainable step (``min_version`` + bound) comes first, in buffer order among equals, instead of
        the oldest in buffer order (``controller.stragglers=wait``: a group that finished late but is due
        now is trained now, not passed over and dropped at the next step)."""
        stale: list[Group] = []
        fresh: deque[tuple[Group, int | None]] = deque()
        for entry in self._groups:
            group, own = entry
            if step - group.min_version > group_bound(own, max_staleness):
                stale.append(group)
            else:
                fresh.append(entry)
        if len(fresh) < count:
            self._groups = fresh
            return [], stale
        order = list(range(len(fresh)))
        if nearest_bound_first:
            order.sort(key=lambda k: fresh[k][0].min_version + group_bound(fresh[k][1], max_staleness))
        taken = set(order[:count])
        batch = [fresh[k][0] for k in order[:count]]
        self._groups = deque(entry for k, entry in enumerate(fresh) if k not in taken)
        return batch, stale


def groups_to_samples(
    groups: Sequence[Group], algo: AlgoConfig, max_new_tokens: int | None = None
) -> list[TrainSample]:
    """Per-token training samples of ``groups`` with advantages from the configured estimator.

    With ``algo.overlong_buffer > 0``, DAPO's soft overlong penalty of each response length
    (``algo.advantages.overlong_penalty`` over the last ``overlong_buffer`` tokens before
    ``max_new_tokens``, the generation budget) is added to the scaled reward before the
    advantages; ``TrainSample.reward`` keeps the verifier's reward.

    Groups of different sizes (``Group.episodes``: episodes of several samples each) are allowed only as
    such: each group's advantages are its own samples' (the estimator on that group alone), and the
    batch normalisation runs over every sample of the batch."""
    if not groups:
        return []
    sizes = {len(g.completions) for g in groups}
    if len(sizes) != 1 and not all(g.episodes for g in groups):
        raise ValueError(f"all groups of a batch must have the same size, got {sorted(sizes)}")
    width = max(sizes)
    mask = torch.tensor([[i < len(g.rewards) for i in range(width)] for g in groups])
    rewards = torch.tensor([_padded(g.rewards, width) for g in groups], dtype=torch.float64)
    scaled = (rewards + algo.reward_bias) * algo.reward_scale
    if algo.overlong_buffer > 0:
        if max_new_tokens is None:
            raise ValueError("algo.overlong_buffer > 0 needs max_new_tokens (rollout.max_new_tokens)")
        lengths = torch.tensor(
            [_padded([len(c.output_ids) for c in g.completions], width) for g in groups], dtype=torch.float64
        )
        scaled = scaled + overlong_penalty(lengths, max_new_tokens, algo.overlong_buffer, algo.overlong_penalty)
    if len(sizes) == 1:
        adv = compute_advantages(scaled, algo.advantage)
    else:
        adv = torch.zeros_like(scaled)
        for gi, group in enumerate(groups):
            n = len(group.rewards)
            adv[gi, :n] = compute_advantages(scaled[gi : gi + 1, :n], algo.advantage)[0]
    if algo.batch_normalize:
        adv = normalize_batch(adv, mask if len(sizes) != 1 else None)
    samples = []
    for gi, group in enumerate(groups):
        for si, comp in enumerate(group.completions):
            a = float(adv[gi, si])
            n_prompt, mask = len(comp.prompt_ids), comp.output_mask  # multi-turn: 0 on environment tokens
            samples.append(
                TrainSample(
                    prompt_id=group.prompt.prompt_id,
                    sample_idx=si,
                    token_ids=tuple(comp.prompt_ids) + tuple(comp.output_ids),
                    loss_mask=(0,) * n_prompt + mask,
                    behav_logprobs=(0.0,) * n_prompt + tuple(comp.behav_logprobs),
                    advantages=(0.0,) * n_prompt + tuple(a if m else 0.0 for m in mask),
                    versions=(-1,) * n_prompt + tuple(comp.versions),
                    min_version=comp.min_version,
                    max_version=comp.max_version,
                    reward=float(group.rewards[si]),
                )
            )
    return samples


def _padded(values: Sequence[float], width: int) -> list[float]:
    return [float(v) for v in values] + [0.0] * (width - len(values))
