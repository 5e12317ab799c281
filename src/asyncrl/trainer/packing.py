"""Padding-free packing and dynamic micro-batching.

- ``split_micro_batches``: assign sequences to micro-batches under a token budget with
  first-fit-decreasing, where a sequence goes to the fitting bin with the fewest tokens
  (balanced bins, AReaL-style), and a bin count that can be forced to a multiple (so
  data-parallel ranks run the same number of micro-batches).
- ``pack``: concatenate the sequences of one micro-batch into one 1-D token stream with
  per-sequence positions and an additive block-diagonal causal mask (attention never crosses a
  sequence boundary; no pad token is computed on).
- ``PackedMicroBatch.gather_token_values``: turn per-position model outputs of the packed stream
  back into ``[num_seqs, max_len]`` tensors aligned with each sequence (for the loss, which is
  written over ``[B, T]``), with the target shift handled in one place: value ``t`` of a
  sequence is produced by the logits at position ``t - 1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def split_micro_batches(
    lengths: Sequence[int], max_tokens: int, *, min_bins: int = 1, multiple_of: int = 1
) -> list[list[int]]:
    """Indices of ``lengths`` grouped into balanced micro-batches of at most ``max_tokens`` tokens.

    A sequence longer than ``max_tokens`` gets a bin of its own (it cannot be split without
    changing the loss). The number of bins is at least ``min_bins`` and a multiple of
    ``multiple_of`` (when there are enough sequences); bins never come out empty."""
    if max_tokens <= 0:
        raise ValueError("max_tokens must be > 0")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    total = sum(lengths)
    needed = max(min_bins, -(-total // max_tokens) if total else 0, 1 if lengths else 0)
    if multiple_of > 1:
        needed = -(-needed // multiple_of) * multiple_of
    needed = min(needed, len(lengths)) if lengths else 0
    while True:
        bins: list[list[int]] = [[] for _ in range(needed)]
        loads = [0] * needed
        overflow = False
        for i in order:
            fitting = [b for b in range(len(bins)) if loads[b] + lengths[i] <= max_tokens or not bins[b]]
            if not fitting:
                overflow = True
                break
            target = min(fitting, key=lambda b: (loads[b], len(bins[b]), b))
            bins[target].append(i)
            loads[target] += lengths[i]
        if not overflow:
            return [sorted(b) for b in bins if b]
        needed += multiple_of


@dataclass
class PackedMicroBatch:
    """One packed micro-batch: a single token stream holding several sequences."""

    input_ids: torch.Tensor
    """``[1, N]`` concatenated token ids."""
    position_ids: torch.Tensor
    """``[1, N]`` positions restarting at 0 for each sequence."""
    attention_mask: torch.Tensor
    """``[1, 1, N, N]`` additive mask: 0 where attention is allowed (causal, same sequence)."""
    seq_lens: list[int]
    sample_indices: list[int]
    """Index of each packed sequence in the caller's sample list."""

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def gather_token_values(self, per_position: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """``[N]`` values computed at each packed position for the *next* token -> ``[B, T]``.

        Row b, column t holds ``per_position[start_b + t - 1]`` (the prediction of token t of
        sequence b); column 0 (no prediction) and padding hold ``fill``."""
        max_len = max(self.seq_lens)
        out = per_position.new_full((len(self.seq_lens), max_len), fill)
        start = 0
        for row, length in enumerate(self.seq_lens):
            if length > 1:
                out[row, 1:length] = per_position[start : start + length - 1]
            start += length
        return out

    def pad_rows(self, rows: Sequence[Sequence[float]], fill: float = 0.0, dtype=torch.float32) -> torch.Tensor:
        """Per-token host values of each sequence (aligned with its token ids) -> ``[B, T]``."""
        max_len = max(self.seq_lens)
        out = torch.full((len(rows), max_len), fill, dtype=dtype)
        for row, values in enumerate(rows):
            out[row, : len(values)] = torch.as_tensor(values, dtype=dtype)
        return out.to(self.input_ids.device)


def pack(
    token_lists: Sequence[Sequence[int]],
    sample_indices: Sequence[int],
    device: str | torch.device = "cpu",
    mask_dtype: torch.dtype = torch.float32,
) -> PackedMicroBatch:
    """Concatenate sequences into one stream with restarting positions and a block-causal mask."""
    if not token_lists:
        raise ValueError("pack() needs at least one sequence")
    lens = [len(t) for t in token_lists]
    ids = torch.tensor([tok for seq in token_lists for tok in seq], dtype=torch.long, device=device)
    positions = torch.cat([torch.arange(n, device=device) for n in lens])
    segment = torch.repeat_interleave(torch.arange(len(lens), device=device), torch.tensor(lens, device=device))
    n = ids.shape[0]
    allowed = (segment[:, None] == segment[None, :]) & (positions[:, None] >= positions[None, :])
    mask = torch.zeros((n, n), dtype=mask_dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(mask_dtype).min)
    return PackedMicroBatch(
        input_ids=ids[None],
        position_ids=positions[None],
        attention_mask=mask[None, None],
        seq_lens=lens,
        sample_indices=list(sample_indices),
    )


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``[N, V]`` logits of a packed stream -> ``[N]`` log-prob of the *next* token at each position
    under softmax(logits / temperature) (the last position gets 0: it predicts nothing packed)."""
    scaled = logits.float() / temperature if temperature != 1.0 else logits.float()
    logp = torch.log_softmax(scaled, dim=-1)
    targets = torch.cat([input_ids[1:], input_ids.new_zeros(1)])
    out = logp.gather(-1, targets[:, None]).squeeze(-1)
    out = torch.cat([out[:-1], out.new_zeros(1)])
    return out
