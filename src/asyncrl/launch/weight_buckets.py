"""Weights as flat byte buckets: what the Ray object-store weight sync puts and every engine reads.

``pack_buckets(state, bucket_bytes)`` turns a ``{name: tensor}`` state dict into a few buckets,
each ``(meta, flat)`` with ``meta = [(name, shape, dtype, nbytes), ...]`` and ``flat`` one
contiguous ``uint8`` numpy array, each tensor padded to ``ALIGN`` bytes (Ray stores numpy arrays
without pickling their bytes and hands them to readers on the same node zero-copy).
``unpack_bucket(meta, flat)`` gives the tensors back as views of ``flat`` (read-only: the engine
copies them into its own weights). A tensor larger than ``bucket_bytes`` is a bucket of its own.
``ObjectStoreUpdate`` is the weight update that carries the buckets' object references instead of
the bytes, so the controller that forwards it to the engines never holds the weights.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["ObjectStoreUpdate", "pack_buckets", "unpack_bucket"]

Meta = list[tuple[str, tuple[int, ...], str, int]]
ALIGN = 16
"""Every tensor starts at a multiple of this many bytes of its bucket (so it can be viewed in place)."""


def _padded(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


@dataclass(frozen=True)
class ObjectStoreUpdate:
    """A versioned weight update whose buckets live in Ray's object store."""

    version: int
    refs: tuple[Any, ...]
    """``ray.ObjectRef`` of each ``(meta, flat)`` bucket."""
    nbytes: int


def pack_buckets(state: dict[str, torch.Tensor], bucket_bytes: int) -> list[tuple[Meta, np.ndarray]]:
    """``state`` as byte buckets of at most ``bucket_bytes`` each (see the module docstring)."""
    if bucket_bytes <= 0:
        raise ValueError("bucket_bytes must be > 0")
    out: list[tuple[Meta, np.ndarray]] = []
    meta: Meta = []
    parts: list[torch.Tensor] = []
    size = 0

    def flush() -> None:
        nonlocal meta, parts, size
        if parts:
            out.append((meta, torch.cat(parts).numpy()))
        meta, parts, size = [], [], 0

    for name, tensor in state.items():
        flat = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        nbytes = int(flat.numel())
        if parts and size + nbytes > bucket_bytes:
            flush()
        meta.append((name, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."), nbytes))
        parts.append(flat)
        if _padded(nbytes) > nbytes:
            parts.append(torch.zeros(_padded(nbytes) - nbytes, dtype=torch.uint8))
        size += _padded(nbytes)
    flush()
    return out


def unpack_bucket(meta: Meta, flat: np.ndarray) -> dict[str, torch.Tensor]:
    """The tensors of one bucket, as views of ``flat``."""
    with warnings.catch_warnings():  # object-store arrays are read-only; the engine only reads them
        warnings.simplefilter("ignore", UserWarning)
        data = torch.from_numpy(flat)
    total = sum(_padded(m[3]) for m in meta)
    if data.numel() != total:
        raise ValueError(f"weight bucket holds {data.numel()} bytes, its metadata says {total}")
    out: dict[str, torch.Tensor] = {}
    offset = 0
    for name, shape, dtype, nbytes in meta:
        out[name] = data[offset : offset + nbytes].view(getattr(torch, dtype)).reshape(shape)
        offset += _padded(nbytes)
    return out
