"""Weight export for engines: a safetensors directory, and a bucketed ``torch.distributed`` broadcast.

This module owns the transports beyond in-process tensors (which are the state dict itself):

- ``save_safetensors_dir(state, out_dir, config)``: ``model.safetensors`` + ``config.json``
  under Hugging Face names, tied duplicates dropped (what ``from_pretrained`` and
  ``rollout.engine.load_update_tensors`` read).
- ``broadcast_state_dict`` (sender, the trainer's rank 0) and ``receive_state_dict`` (every
  engine rank of the same group): the names/shapes/dtypes go first as one object, then the
  tensors as flat byte buckets of at most ``bucket_bytes`` (one collective per bucket instead
  of one per parameter, which is what made peers' weight sync slow). The receive side only
  needs torch and can run inside any engine process.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def drop_tied_duplicates(state: dict[str, torch.Tensor], tied: dict[str, str] | None) -> dict[str, torch.Tensor]:
    """Remove tied targets (``{target: source}``) whose source is present (HF saves one copy)."""
    if not tied:
        return dict(state)
    return {k: v for k, v in state.items() if not (k in tied and tied[k] in state)}


def save_safetensors_dir(
    state: dict[str, torch.Tensor],
    out_dir: str | Path,
    config: Any = None,
    *,
    tied: dict[str, str] | None = None,
    generation_config: Any = None,
) -> tuple[Path, int]:
    """Write ``state`` as ``out_dir/model.safetensors`` (+ ``config.json``); returns (dir, bytes)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in drop_tied_duplicates(state, tied).items()}
    tmp = out / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(out / "model.safetensors")
    if config is not None:
        config.save_pretrained(str(out))
    if generation_config is not None:
        generation_config.save_pretrained(str(out))
    return out, sum(t.numel() * t.element_size() for t in tensors.values())


def _buckets(meta: list[tuple[str, tuple[int, ...], str, int]], bucket_bytes: int) -> list[list[int]]:
    """Consecutive parameter indices grouped into buckets of at most ``bucket_bytes`` (a larger
    tensor is a bucket of its own)."""
    out: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, (_, _, _, nbytes) in enumerate(meta):
        if current and size + nbytes > bucket_bytes:
            out.append(current)
            current, size = [], 0
        current.append(i)
        size += nbytes
    if current:
        out.append(current)
    return out


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


def broadcast_state_dict(
    state: dict[str, torch.Tensor],
    *,
    src: int = 0,
    group: Any = None,
    bucket_bytes: int = 1 << 30,
    device: str | torch.device = "cpu",
) -> dict[str, float]:
    """Sender side (rank ``src``): broadcast ``state`` in byte buckets; returns timing metrics.

    Every other rank of ``group`` must call ``receive_state_dict`` with the same ``src``."""
    t0 = time.perf_counter()
    names = list(state)
    meta = [(n, tuple(state[n].shape), str(state[n].dtype), state[n].numel() * state[n].element_size()) for n in names]
    box: list[Any] = [(meta, bucket_bytes)]
    dist.broadcast_object_list(box, src=src, group=group)
    total = 0
    buckets = _buckets(meta, bucket_bytes)
    for bucket in buckets:
        flat = torch.cat([state[names[i]].detach().contiguous().reshape(-1).view(torch.uint8) for i in bucket])
        flat = flat.to(device)
        dist.broadcast(flat, src=src, group=group)
        total += flat.numel()
    return {"broadcast_s": time.perf_counter() - t0, "broadcast_bytes": float(total), "broadcast_buckets": len(buckets)}


def receive_state_dict(
    *, src: int = 0, group: Any = None, device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """Receiver side: the state dict broadcast by ``broadcast_state_dict`` from rank ``src``."""
    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=src, group=group)
    meta, bucket_bytes = box[0]
    out: dict[str, torch.Tensor] = {}
    for bucket in _buckets(meta, bucket_bytes):
        nbytes = sum(meta[i][3] for i in bucket)
        flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
        dist.broadcast(flat, src=src, group=group)
        offset = 0
        for i in bucket:
            name, shape, dtype, size = meta[i]
            out[name] = flat[offset : offset + size].view(_dtype(dtype)).reshape(shape).clone()
            offset += size
    return out


def write_export_manifest(out_dir: Path, version: int, seconds: float, nbytes: int) -> None:
    """A small JSON next to an exported directory (which version, how long, how big)."""
    (out_dir / "asyncrl_export.json").write_text(
        json.dumps({"version": version, "export_s": seconds, "bytes": nbytes}, indent=2)
    )
