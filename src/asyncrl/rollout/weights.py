"""Weight updates for ``LocalEngine``: read a ``WeightUpdate`` and copy it into a model, all-or-nothing.

Owns the two transports the engine accepts in process: an in-memory ``{HF parameter name: tensor}``
state dict, or a directory holding ``model.safetensors`` (or a sharded
``model.safetensors.index.json``). Every name and shape is checked before the first copy, so a bad
update leaves the weights untouched.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from asyncrl.types import WeightUpdate

__all__ = ["load_update_tensors", "copy_state"]


def load_update_tensors(update: WeightUpdate) -> dict[str, torch.Tensor]:
    """The ``{HF name: tensor}`` state dict of a weight update (in-process tensors or a safetensors dir)."""
    if update.tensors is not None:
        return update.tensors
    from safetensors.torch import load_file

    path = Path(update.path)  # type: ignore[arg-type]
    single = path / "model.safetensors"
    if single.is_file():
        return load_file(str(single))
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        out: dict[str, torch.Tensor] = {}
        for shard in shards:
            out.update(load_file(str(path / shard)))
        return out
    raise FileNotFoundError(f"weight update: {path} holds no model.safetensors (or sharded index)")


def copy_state(state: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor], version: int) -> None:
    """Copy ``tensors`` into ``state`` (tensors sharing storage with a model's parameters).

    Raises ``KeyError`` for unknown names and ``ValueError`` for shape mismatches, before copying
    anything. Names absent from ``tensors`` keep their values (e.g. a tied ``lm_head.weight``)."""
    unknown = [k for k in tensors if k not in state]
    if unknown:
        raise KeyError(f"weight update v{version}: unknown parameter names {unknown[:5]}")
    for name, value in tensors.items():
        want = tuple(state[name].shape)
        if tuple(value.shape) != want:
            raise ValueError(f"weight update v{version}: {name} has shape {tuple(value.shape)}, want {want}")
    with torch.no_grad():
        for name, value in tensors.items():
            state[name].copy_(value)
