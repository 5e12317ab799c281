"""Padding-free packing and dynamic micro-batching.

This module owns how the sequences of a training step become forward passes:

- ``split_micro_batches``: assign sequences to micro-batches under a token budget, balanced,
  with first-fit-decreasing (a sequence goes to the fitting bin with the fewest tokens,
  AReaL-style) or Karmarkar–Karp (largest differencing over a fixed bin count), and a bin count
  that can be forced to at least / a multiple of a number.
- ``partition_balanced``: split sequences into ``k`` groups of balanced token counts (the
  data-parallel ranks), with Karmarkar–Karp or greedy longest-first.
- ``plan_micro_batches``: both together: per rank, the micro-batches of that rank, every rank
  with the same number of micro-batches (FSDP runs collectives in every forward/backward, so
  every rank must make the same number of passes; a rank short of sequences gets empty
  micro-batches, which the trainer runs as zero-weight dummies).
- ``pack``: concatenate the sequences of one micro-batch into one ``[1, N]`` token stream with
  per-sequence positions and ``cu_seqlens`` (the varlen layout). No pad token and no ``N x N``
  mask: the attention in ``trainer.attention`` runs per sequence from ``cu_seqlens``.
- ``PackedMicroBatch``: the packed stream plus the helpers that move per-token values between
  the stream and the samples, with the target shift in one place: the value of token ``t`` of a
  sequence is produced by the logits at position ``t - 1`` of that sequence.
- ``pad_batch``: the padded layout (``[B, T]`` + attention mask), for the padded baseline and
  the reference tests.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from asyncrl.choices import BalanceMethod, check_choice, choice_error

RowValues = Sequence[float] | torch.Tensor


# ----------------------------------------------------------------------------------- partitioning
def karmarkar_karp(lengths: Sequence[int], k: int) -> list[list[int]]:
    """Indices of ``lengths`` in ``k`` groups of near-equal sums (multiway largest differencing).

    Every item starts as a k-way partition with the item alone in one part; the two partitions
    with the largest spread are merged (largest part of one with the smallest of the other) until
    one remains. Groups may be empty only when there are fewer items than ``k``."""
    if k <= 0:
        raise ValueError("k must be > 0")
    if not lengths:
        return [[] for _ in range(k)]
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []
    for tie, i in enumerate(sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))):
        parts = [(int(lengths[i]), [i])] + [(0, []) for _ in range(k - 1)]
        heapq.heappush(heap, (-int(lengths[i]), tie, parts))
    tie = len(lengths)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        # a, b are sorted by sum descending: pair a's largest with b's smallest
        merged = [(a[j][0] + b[k - 1 - j][0], a[j][1] + b[k - 1 - j][1]) for j in range(k)]
        merged.sort(key=lambda p: (-p[0], p[1][0] if p[1] else -1))
        tie += 1
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), tie, merged))
    return [sorted(p[1]) for p in heap[0][2]]


def _greedy_partition(lengths: Sequence[int], k: int) -> list[list[int]]:
    """Longest-first greedy: each sequence to the group with the smallest sum (then fewest items)."""
    groups: list[list[int]] = [[] for _ in range(k)]
    loads = [0] * k
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        g = min(range(k), key=lambda b: (loads[b], len(groups[b]), b))
        groups[g].append(i)
        loads[g] += lengths[i]
    return [sorted(g) for g in groups]


def partition_balanced(lengths: Sequence[int], k: int, method: BalanceMethod) -> list[list[int]]:
    """Indices of ``lengths`` split into exactly ``k`` groups with balanced token sums.

    ``method``: ``kk`` (Karmarkar–Karp) or ``ffd`` (greedy longest-first). With at least ``k``
    sequences no group is empty."""
    if k <= 0:
        raise ValueError("k must be > 0")
    match method:
        case "kk":
            groups = karmarkar_karp(lengths, k)
        case "ffd":
            groups = _greedy_partition(lengths, k)
        case _:
            raise choice_error(method, BalanceMethod, "balance method")
    if len(lengths) >= k and any(not g for g in groups):  # cannot happen for kk/greedy, kept as a guard
        raise AssertionError("balanced partition produced an empty group")
    return groups


def split_micro_batches(
    lengths: Sequence[int],
    max_tokens: int,
    *,
    min_bins: int = 1,
    multiple_of: int = 1,
    method: BalanceMethod = "ffd",
) -> list[list[int]]:
    """Indices of ``lengths`` grouped into balanced micro-batches of at most ``max_tokens`` tokens.

    A sequence longer than ``max_tokens`` gets a bin of its own (it cannot be split without
    changing the loss). The number of bins is at least ``min_bins`` and a multiple of
    ``multiple_of`` (when there are enough sequences); bins never come out empty.

    ``method``: ``ffd`` puts each sequence (longest first) into the fitting bin with the fewest
    tokens; ``kk`` partitions into the bin count with Karmarkar–Karp. Either way the bin count
    grows until every bin fits the budget."""
    if max_tokens <= 0:
        raise ValueError("max_tokens must be > 0")
    check_choice(method, BalanceMethod, "balance method")
    if not lengths:
        return []
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    total = sum(lengths)
    oversized = sum(1 for n in lengths if n > max_tokens)
    needed = max(min_bins, -(-total // max_tokens), oversized, 1)
    step = max(1, multiple_of)
    needed = -(-needed // step) * step
    needed = min(needed, len(lengths))
    while True:
        if method == "kk":
            bins = karmarkar_karp(lengths, needed)
            if all(sum(lengths[i] for i in b) <= max_tokens or len(b) == 1 for b in bins):
                return [b for b in bins if b]
        else:
            bins = [[] for _ in range(needed)]
            loads = [0] * needed
            overflow = False
            for i in order:
                fitting = [b for b in range(needed) if loads[b] + lengths[i] <= max_tokens or not bins[b]]
                if not fitting:
                    overflow = True
                    break
                target = min(fitting, key=lambda b: (loads[b], len(bins[b]), b))
                bins[target].append(i)
                loads[target] += lengths[i]
            if not overflow:
                return [sorted(b) for b in bins if b]
        if needed >= len(lengths):  # one sequence per bin always fits (oversized ones alone)
            return [[i] for i in range(len(lengths))]
        needed = min(len(lengths), needed + step)


def plan_micro_batches(
    lengths: Sequence[int], max_tokens: int, *, world_size: int = 1, method: BalanceMethod = "ffd"
) -> list[list[list[int]]]:
    """Per data-parallel rank, its micro-batches (lists of indices into ``lengths``).

    Sequences are first split across ranks with balanced token counts (Karmarkar–Karp for
    ``kk``, greedy longest-first for ``ffd``), then each rank's share into micro-batches under
    ``max_tokens``. Every rank gets the same number of micro-batches: a rank with fewer bins
    re-splits into more (balanced) bins, and when it has fewer sequences than bins its extra
    micro-batches are empty lists. Deterministic: every rank computes the same plan."""
    if world_size <= 0:
        raise ValueError("world_size must be > 0")
    shares = [list(range(len(lengths)))] if world_size == 1 else partition_balanced(lengths, world_size, method)
    per_rank: list[list[list[int]]] = []
    for share in shares:
        local = split_micro_batches([lengths[i] for i in share], max_tokens, method=method)
        per_rank.append([[share[j] for j in b] for b in local])
    count = max(len(bins) for bins in per_rank)
    for r, share in enumerate(shares):
        if len(per_rank[r]) < count:
            local = split_micro_batches([lengths[i] for i in share], max_tokens, min_bins=count, method=method)
            bins = [[share[j] for j in b] for b in local]
            per_rank[r] = bins + [[] for _ in range(count - len(bins))]
    return per_rank


# ----------------------------------------------------------------------------------- packing
@dataclass
class PackedMicroBatch:
    """One packed micro-batch: a single token stream holding several whole sequences."""

    input_ids: torch.Tensor
    """``[1, N]`` concatenated token ids."""
    position_ids: torch.Tensor
    """``[1, N]`` positions restarting at 0 for each sequence."""
    cu_seqlens: torch.Tensor
    """``[S + 1]`` int32 offsets ``[0, len_0, len_0 + len_1, ..., N]`` (flash-attention varlen layout)."""
    seq_lens: list[int]
    sample_indices: list[int]
    """Index of each packed sequence in the caller's sample list."""

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def max_seqlen(self) -> int:
        return max(self.seq_lens)

    @property
    def starts(self) -> list[int]:
        """Offset of each sequence in the stream."""
        return [int(x) for x in self.cu_seqlens[:-1].tolist()]

    def model_inputs(self) -> dict[str, object]:
        """Keyword arguments for a transformers causal LM: ids, positions and the varlen
        ``cu_seq_lens_*`` / ``max_length_*`` that the packed attention (ours or flash-attention's)
        reads. No attention mask: nothing is padded."""
        return {
            "input_ids": self.input_ids,
            "position_ids": self.position_ids,
            "cu_seq_lens_q": self.cu_seqlens,
            "cu_seq_lens_k": self.cu_seqlens,
            "max_length_q": self.max_seqlen,
            "max_length_k": self.max_seqlen,
        }

    def shift_to_tokens(self, per_position: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """``[N]`` values computed at each position for the *next* token -> ``[N]`` values aligned
        with the tokens: entry ``p`` takes ``per_position[p - 1]``; the first token of each
        sequence (no prediction) gets ``fill``. Differentiable."""
        shifted = torch.cat([per_position.new_full((1,), fill), per_position[:-1]])
        starts = self.cu_seqlens[:-1].to(device=per_position.device, dtype=torch.long)
        return shifted.index_fill(0, starts, fill)

    def cat_rows(self, rows: Sequence[RowValues], dtype: torch.dtype = torch.float32, fill: float = 0.0) -> Tensor:
        """Per-token values of each packed sequence (aligned with its token ids) -> ``[N]``.
        (``fill`` is unused: a packed stream has no padding; kept for the common interface.)"""
        device = self.input_ids.device
        if rows and isinstance(rows[0], torch.Tensor):
            flat_t = torch.cat([torch.as_tensor(r).reshape(-1) for r in rows]).to(device=device, dtype=dtype)
        else:
            flat_t = torch.tensor([v for row in rows for v in row], dtype=dtype, device=device)
        if flat_t.numel() != self.num_tokens:
            raise ValueError(f"cat_rows: {flat_t.numel()} values for a stream of {self.num_tokens} tokens")
        return flat_t

    def token_logp(self, logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """``[1, N, V]`` (or ``[N, V]``) logits of the stream -> ``[N]`` log-prob of each token given
        the tokens before it in its sequence (0 for each sequence's first token)."""
        if logits.dim() == 3:
            logits = logits[0]
        return self.shift_to_tokens(token_logprobs(logits, self.input_ids[0], temperature))

    def loss_kwargs(self) -> dict[str, torch.Tensor]:
        """What ``policy_loss`` needs to see the sequences of the stream."""
        return {"cu_seqlens": self.cu_seqlens}

    def split_rows(self, values: torch.Tensor) -> list[torch.Tensor]:
        """``[N]`` stream values -> one tensor per packed sequence (views, in packing order)."""
        return list(torch.split(values, self.seq_lens))

    def dense_causal_mask(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The ``[1, 1, N, N]`` additive block-diagonal causal mask equivalent to the varlen
        attention (a reference for tests; O(N²), never used for training)."""
        device = self.input_ids.device
        lens = torch.tensor(self.seq_lens, device=device)
        segment = torch.repeat_interleave(torch.arange(len(self.seq_lens), device=device), lens)
        pos = self.position_ids[0]
        allowed = (segment[:, None] == segment[None, :]) & (pos[:, None] >= pos[None, :])
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
        return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]


def pack(
    token_lists: Sequence[Sequence[int]],
    sample_indices: Sequence[int],
    device: str | torch.device = "cpu",
) -> PackedMicroBatch:
    """Concatenate whole sequences into one stream with restarting positions and ``cu_seqlens``."""
    if not token_lists:
        raise ValueError("pack() needs at least one sequence")
    lens = [len(t) for t in token_lists]
    if min(lens) <= 0:
        raise ValueError("pack(): empty sequence")
    ids = torch.tensor([tok for seq in token_lists for tok in seq], dtype=torch.long)
    positions = torch.cat([torch.arange(n) for n in lens])
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lens), 0)
    return PackedMicroBatch(
        input_ids=ids[None].to(device),
        position_ids=positions[None].to(device),
        cu_seqlens=cu.to(device),
        seq_lens=lens,
        sample_indices=list(sample_indices),
    )


@dataclass
class PaddedMicroBatch:
    """One padded micro-batch: ``[B, T]`` right-padded sequences with an attention mask (the
    baseline layout; same interface as ``PackedMicroBatch``)."""

    input_ids: torch.Tensor
    """``[B, T]`` token ids, right-padded."""
    attention_mask: torch.Tensor
    """``[B, T]`` 1 on real tokens, 0 on padding."""
    seq_lens: list[int]
    sample_indices: list[int]

    @property
    def num_tokens(self) -> int:
        """Real (non-pad) tokens."""
        return sum(self.seq_lens)

    @property
    def padded_tokens(self) -> int:
        return int(self.input_ids.numel())

    def model_inputs(self) -> dict[str, object]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask}

    def cat_rows(self, rows: Sequence[RowValues], dtype: torch.dtype = torch.float32, fill: float = 0.0) -> Tensor:
        """Per-token values of each sequence -> ``[B, T]`` (padding holds ``fill``)."""
        out = torch.full(tuple(self.input_ids.shape), fill, dtype=dtype)
        for row, values in enumerate(rows):
            t = torch.as_tensor(values if isinstance(values, torch.Tensor) else list(values), dtype=dtype)
            out[row, : t.numel()] = t.reshape(-1).cpu()
        return out.to(self.input_ids.device)

    def token_logp(self, logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """``[B, T, V]`` logits -> ``[B, T]`` log-prob of token t given tokens < t (column 0 and
        padding are 0)."""
        per = token_logprobs(logits, self.input_ids, temperature)
        shifted = torch.cat([per.new_zeros(per.shape[0], 1), per[:, :-1]], dim=1)
        return torch.where(self.attention_mask.bool(), shifted, shifted.new_zeros(()))

    def split_rows(self, values: torch.Tensor) -> list[torch.Tensor]:
        return [values[row, :n] for row, n in enumerate(self.seq_lens)]

    def loss_kwargs(self) -> dict[str, torch.Tensor]:
        return {}


def pad(
    token_lists: Sequence[Sequence[int]],
    sample_indices: Sequence[int],
    device: str | torch.device = "cpu",
    pad_id: int = 0,
) -> PaddedMicroBatch:
    """Right-pad sequences into one ``[B, T]`` micro-batch."""
    if not token_lists:
        raise ValueError("pad() needs at least one sequence")
    ids, mask = pad_batch(token_lists, pad_id, device)
    return PaddedMicroBatch(ids, mask, [len(t) for t in token_lists], list(sample_indices))


def pad_batch(
    token_lists: Sequence[Sequence[int]], pad_id: int = 0, device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``[B, T]`` ids and the ``[B, T]`` 0/1 attention mask (the padded layout)."""
    width = max(len(t) for t in token_lists)
    ids = torch.full((len(token_lists), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(token_lists), width), dtype=torch.long)
    for row, toks in enumerate(token_lists):
        ids[row, : len(toks)] = torch.tensor(list(toks), dtype=torch.long)
        mask[row, : len(toks)] = 1
    return ids.to(device), mask.to(device)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``[..., N, V]`` logits -> ``[..., N]`` log-prob of the *next* token at each position under
    softmax(logits / temperature); the last position (no next token) gets 0.

    Computed as ``logit[target] - logsumexp(logits)`` in float32, without materialising the full
    log-softmax matrix (one ``N x V`` buffer fewer)."""
    scaled = logits.float()
    if temperature != 1.0:
        scaled = scaled / temperature
    targets = torch.cat([input_ids[..., 1:], input_ids.new_zeros(input_ids.shape[:-1] + (1,))], dim=-1)
    picked = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    out = picked - torch.logsumexp(scaled, dim=-1)
    return torch.cat([out[..., :-1], out.new_zeros(out.shape[:-1] + (1,))], dim=-1)
