"""Loss aggregation: how per-token loss terms become one scalar (DESIGN §5).

This module owns two things that every loss in ``asyncrl.algo`` shares:

- :class:`Segments`, which says which sequence each token belongs to. Sequences are either the
  rows of a right-padded ``[B, T]`` tensor (the default), or runs of a packed, padding-free row
  described by ``cu_seqlens`` (flash-attention varlen layout: ``[0, len_0, len_0 + len_1, ...]``
  over a ``[N]`` or ``[1, N]`` tensor).
- :func:`aggregate_loss`, the explicit aggregation modes and the *global denominator* contract
  that makes micro-batching and data parallelism invisible: when one global batch is split into
  micro-batches (and ranks), each call is given the global denominator, so that the sum of the
  micro-batch losses equals the loss of the whole batch exactly.

Masked-out positions never contribute, even if the per-token values there are NaN or inf
(``torch.where`` is used, never multiplication by the mask).
"""

from __future__ import annotations

import torch
from torch import Tensor

from asyncrl.choices import Aggregation, choice_error


class Segments:
    """Token -> sequence assignment for a ``[B, T]`` batch (rows) or a packed row (``cu_seqlens``).

    ``sum`` reduces a per-token tensor to one value per sequence; ``expand`` broadcasts one value
    per sequence back to every token. Both are differentiable.
    """

    def __init__(self, shape: torch.Size, device: torch.device, cu_seqlens: Tensor | None = None) -> None:
        self.shape = torch.Size(shape)
        if cu_seqlens is None:
            if len(self.shape) != 2:
                raise ValueError(
                    f"expected [B, T] tensors (one sequence per row), got shape {tuple(self.shape)}; "
                    "for a packed row pass cu_seqlens"
                )
            self.num_seqs = int(self.shape[0])
            self.row_len: int | None = int(self.shape[1])
            self.seg_ids: Tensor | None = None
            return
        if len(self.shape) not in (1, 2) or (len(self.shape) == 2 and self.shape[0] != 1):
            raise ValueError(f"with cu_seqlens, tensors must be [N] or [1, N], got shape {tuple(self.shape)}")
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
            raise ValueError("cu_seqlens must be a 1-D tensor [num_seqs + 1] starting at 0")
        n = int(self.shape[-1])
        cu = cu_seqlens.to(device=device, dtype=torch.long)
        lengths = cu[1:] - cu[:-1]
        ok = (cu[0] == 0) & (cu[-1] == n) & (lengths >= 0).all()
        if not bool(ok):
            raise ValueError(
                f"cu_seqlens must start at 0, be non-decreasing and end at the token count {n}; got {cu.tolist()}"
            )
        self.num_seqs = int(lengths.numel())
        self.row_len = None
        self.seg_ids = torch.repeat_interleave(torch.arange(self.num_seqs, device=device), lengths, output_size=n)

    def sum(self, x: Tensor) -> Tensor:
        """Per-sequence sum of a per-token tensor: ``[num_seqs]``."""
        if self.seg_ids is None:
            return x.sum(dim=-1)
        out = torch.zeros(self.num_seqs, dtype=x.dtype, device=x.device)
        return out.index_add(0, self.seg_ids, x.reshape(-1))

    def expand(self, v: Tensor) -> Tensor:
        """Broadcast one value per sequence (``[num_seqs]``) to every token (the batch shape)."""
        if self.seg_ids is None:
            return v.unsqueeze(-1).expand(self.shape)
        return v.index_select(0, self.seg_ids).reshape(self.shape)


def check_denominator(denominator: float | Tensor | None) -> None:
    """A given denominator must be a positive number (a tensor is trusted as is)."""
    if denominator is None or isinstance(denominator, Tensor):
        return
    if not float(denominator) > 0.0:  # also rejects NaN
        raise ValueError(f"denominator must be > 0 (the global normaliser), got {denominator!r}")


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    aggregation: Aggregation,
    denominator: float | Tensor | None,
    segments: Segments | None,
) -> Tensor:
    """Core of :func:`aggregate_loss` for an already boolean ``mask`` and prebuilt ``segments``
    (built lazily for ``[B, T]`` input when ``None``)."""
    check_denominator(denominator)
    x = torch.where(mask, per_token, torch.zeros((), dtype=per_token.dtype, device=per_token.device))
    match aggregation:
        case "token_mean":
            num = x.sum()
            den = mask.sum().clamp(min=1) if denominator is None else denominator
        case "seq_mean_token_mean":
            segs = segments if segments is not None else Segments(x.shape, x.device)
            n_tok = segs.sum(mask.to(x.dtype))
            num = (segs.sum(x) / n_tok.clamp(min=1)).sum()
            den = (n_tok > 0).sum().clamp(min=1) if denominator is None else denominator
        case "seq_mean_token_sum":
            num = x.sum()
            if denominator is not None:
                den = denominator
            else:
                segs = segments if segments is not None else Segments(x.shape, x.device)
                if segs.row_len is None:
                    raise ValueError(
                        "seq_mean_token_sum on a packed row needs an explicit denominator "
                        "(num_sequences x max_length, the constant normaliser)"
                    )
                den = max(segs.num_seqs * segs.row_len, 1)
        case _:
            raise choice_error(aggregation, Aggregation, "aggregation")
    return num / den


def aggregate_loss(
    per_token: Tensor,
    loss_mask: Tensor,
    aggregation: Aggregation = "token_mean",
    denominator: float | Tensor | None = None,
    *,
    cu_seqlens: Tensor | None = None,
) -> Tensor:
    """Reduce per-token loss terms to a scalar over the tokens where ``loss_mask`` is nonzero.

    - ``token_mean``: sum over loss tokens / number of loss tokens.
    - ``seq_mean_token_mean``: mean, over sequences with at least one loss token, of each
      sequence's token mean.
    - ``seq_mean_token_sum``: sum over loss tokens / (number of sequences x T), Dr.GRPO's constant
      normaliser (T = the padded length of the ``[B, T]`` input; for packed input the caller must
      pass ``denominator``).

    ``denominator``: ``None`` uses the local normaliser above. When a global batch is split into
    micro-batches (and data-parallel ranks), pass the GLOBAL one (global loss-token count for
    ``token_mean``; global count of sequences with >= 1 loss token for ``seq_mean_token_mean``;
    global num_sequences x T for ``seq_mean_token_sum``): the micro-batch losses then sum to the
    whole-batch loss. A batch without loss tokens gives 0 (with a zero gradient), never NaN.
    """
    mask = loss_mask != 0
    if mask.shape != per_token.shape:
        raise ValueError(f"loss_mask shape {tuple(mask.shape)} != per-token shape {tuple(per_token.shape)}")
    segments = Segments(per_token.shape, per_token.device, cu_seqlens) if cu_seqlens is not None else None
    return aggregate(per_token, mask, aggregation, denominator, segments)
