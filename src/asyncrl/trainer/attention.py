"""Variable-length (padding-free) attention for packed training streams.

This module owns the attention implementation the trainer runs its models with. A packed
micro-batch is one ``[1, N]`` token stream holding several sequences (see ``packing``); the
model must attend within each sequence only, and must not pay for an ``N x N`` mask.

- ``VARLEN_ATTENTION`` (``"asyncrl_varlen"``) is registered with transformers'
  ``AttentionInterface``. Given ``cu_seq_lens_q`` (the flash-attention varlen layout
  ``[0, len_0, len_0 + len_1, ...]``, passed as a forward kwarg that transformers hands down to
  every attention layer), it runs causal scaled-dot-product attention per sequence segment:
  the cost is ``sum(len_i^2)``, not ``N^2``, and no pad token exists. Without ``cu_seq_lens_q``
  it derives the segments from ``position_ids`` resets; with a padding mask (an ordinary padded
  batch) it falls back to masked SDPA, so the model still works as a normal model.
- The matching mask function (``AttentionMaskInterface``) builds no mask for packed input, and
  transformers' SDPA mask for padded input.
- ``select_attention(device, dtype)`` picks ``flash_attention_2`` (transformers' own varlen
  flash-attention path, which consumes the same ``cu_seq_lens_*`` / ``max_length_*`` kwargs)
  on CUDA when ``flash_attn`` is installed and the dtype is half precision, and
  ``VARLEN_ATTENTION`` everywhere else; ``use_packed_attention(model)`` applies it.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
import torch.nn.functional as F

VARLEN_ATTENTION = "asyncrl_varlen"
"""Name of the per-segment attention registered with transformers."""

_registered = False


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float | None,
    dropout: float,
) -> torch.Tensor:
    """SDPA on ``[B, H, L, D]`` with grouped-query heads expanded by the kernel."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal, scale=scale, enable_gqa=k.shape[1] != q.shape[1]
    )


def _segments_from_positions(position_ids: torch.Tensor) -> list[list[int]]:
    """Per row, segment boundaries ``[0, ..., L]`` where positions restart (drop to <= previous)."""
    out = []
    for row in position_ids.tolist():
        bounds = [0]
        for i in range(1, len(row)):
            if row[i] <= row[i - 1]:
                bounds.append(i)
        bounds.append(len(row))
        out.append(bounds)
    return out


def _attend_segments(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[int], scale: float | None, dropout: float
) -> torch.Tensor:
    """Causal attention within each ``[bounds[i], bounds[i+1])`` run of one row (``[1, H, N, D]``).

    Segments of equal length are stacked into one batched SDPA call (no padding is created)."""
    by_len: dict[int, list[int]] = {}
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        if end > start:
            by_len.setdefault(end - start, []).append(start)
    if len(by_len) == 1 and len(next(iter(by_len.values()))) == 1:
        return _sdpa(q, k, v, mask=None, causal=True, scale=scale, dropout=dropout)
    out = torch.empty_like(q)
    for length, starts in by_len.items():
        if len(starts) == 1:
            s = starts[0]
            out[:, :, s : s + length] = _sdpa(
                q[:, :, s : s + length],
                k[:, :, s : s + length],
                v[:, :, s : s + length],
                mask=None,
                causal=True,
                scale=scale,
                dropout=dropout,
            )
            continue
        # [1, H, N, D] -> [n, H, length, D] for the n segments of this length
        idx = torch.tensor(starts, device=q.device)[:, None] + torch.arange(length, device=q.device)[None, :]
        flat = idx.reshape(-1)

        def take(x: torch.Tensor, idx: torch.Tensor = idx, flat: torch.Tensor = flat) -> torch.Tensor:
            return x[0].index_select(1, flat).unflatten(1, idx.shape).transpose(0, 1)

        seg = _sdpa(take(q), take(k), take(v), mask=None, causal=True, scale=scale, dropout=dropout)
        out[0].index_copy_(1, flat, seg.transpose(0, 1).flatten(1, 2))
    return out


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The ``AttentionInterface`` function: ``[B, H, L, D]`` in, ``[B, L, H, D]`` out (transformers' layout)."""
    q_len, kv_len = query.shape[2], key.shape[2]
    cu = kwargs.get("cu_seq_lens_q")
    position_ids = kwargs.get("position_ids")
    if attention_mask is not None:
        mask = attention_mask
        if mask.dtype != torch.bool and mask.dtype != query.dtype:
            mask = mask.to(query.dtype)
        out = _sdpa(query, key, value, mask=mask, causal=False, scale=scaling, dropout=dropout)
    elif q_len != kv_len:
        # cached decoding: queries are the last q_len positions (bottom-right aligned causal mask)
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(kv_len - q_len)
        out = _sdpa(query, key, value, mask=mask, causal=False, scale=scaling, dropout=dropout)
    elif cu is not None and query.shape[0] == 1:
        bounds = [int(b) for b in cu.tolist()]
        if bounds[-1] != q_len:
            raise ValueError(f"cu_seq_lens_q ends at {bounds[-1]} but the stream holds {q_len} tokens")
        out = _attend_segments(query, key, value, bounds, scaling, dropout)
    elif position_ids is not None and position_ids.shape[-1] == q_len:
        rows = _segments_from_positions(position_ids.expand(query.shape[0], -1))
        out = torch.cat(
            [
                _attend_segments(query[b : b + 1], key[b : b + 1], value[b : b + 1], rows[b], scaling, dropout)
                for b in range(query.shape[0])
            ]
        )
    else:
        out = _sdpa(query, key, value, mask=None, causal=True, scale=scaling, dropout=dropout)
    return out.transpose(1, 2).contiguous(), None


def varlen_attention_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor | None:
    """The ``AttentionMaskInterface`` function: no mask for packed/unpadded input (segments come
    from ``cu_seq_lens_q`` or position resets), transformers' SDPA mask when there is padding."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None or (attention_mask.shape[-1] == kv_length and bool(attention_mask.all())):
        if q_length == kv_length:
            return None
    kwargs.pop("allow_is_causal_skip", None)
    return sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        attention_mask=attention_mask,
        allow_is_causal_skip=False,
        **kwargs,
    )


def register_varlen_attention() -> str:
    """Register ``VARLEN_ATTENTION`` (and its mask function) with transformers; idempotent."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(VARLEN_ATTENTION, varlen_attention_forward)
        AttentionMaskInterface.register(VARLEN_ATTENTION, varlen_attention_mask)
        _registered = True
    return VARLEN_ATTENTION


def flash_attn_available() -> bool:
    """True when the ``flash_attn`` package (varlen kernels) is importable and CUDA is present."""
    return torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None


def select_attention(device: str | torch.device, dtype: torch.dtype) -> str:
    """The attention implementation for packed training on ``device`` with parameters of ``dtype``."""
    if torch.device(device).type == "cuda" and dtype in (torch.float16, torch.bfloat16) and flash_attn_available():
        return "flash_attention_2"
    return register_varlen_attention()


def use_packed_attention(model: Any, device: str | torch.device, dtype: torch.dtype | None = None) -> str:
    """Switch ``model`` (a transformers ``PreTrainedModel``) to padding-free attention; returns the name."""
    if dtype is None:
        dtype = next(model.parameters()).dtype
    name = select_attention(device, dtype)
    if name == VARLEN_ATTENTION:
        register_varlen_attention()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:  # pragma: no cover - non-transformers models carry the name in their config
        model.config._attn_implementation = name
    return name
