"""Weight updates for ``LocalEngine``: read a ``WeightUpdate`` and copy it into a model, all-or-nothing.

Owns the two transports the engine accepts in process: an in-memory ``{HF parameter name: tensor}``
state dict, or a directory holding ``model.safetensors`` (or a sharded
``model.safetensors.index.json``, whose shards must be files of that directory). Every file is read and
every name and shape checked before the first copy, so a bad update (a file that is not safetensors
included: ``ValueError``) leaves the weights untouched.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from asyncrl.types import WeightUpdate

__all__ = ["load_update_tensors", "copy_state"]


def load_update_tensors(update: WeightUpdate) -> dict[str, torch.Tensor]:
    """The ``{HF name: tensor}`` state dict of a weight update (in-process tensors or a safetensors dir).

    Raises ``FileNotFoundError`` when the directory holds neither file, and ``ValueError`` (naming the
    file) for a file that is not safetensors or an index that is not ``{"weight_map": {name: shard}}``
    with shards inside the directory."""
    if update.tensors is not None:
        return update.tensors
    path = Path(update.path)  # type: ignore[arg-type]
    single = path / "model.safetensors"
    if single.is_file():
        return _load(single)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        out: dict[str, torch.Tensor] = {}
        for shard in _shards(index):
            out.update(_load(path / shard))
        return out
    raise FileNotFoundError(f"weight update: {path} holds no model.safetensors (or sharded index)")


def _load(file: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(file))
    except SafetensorError as e:
        raise ValueError(f"weight update: {file} is not a readable safetensors file ({e})") from None


def _shards(index: Path) -> list[str]:
    """The shard file names of a sharded checkpoint's index (plain names in its directory)."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
    except (ValueError, AttributeError) as e:
        raise ValueError(f"weight update: {index} is not a JSON object ({e})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"weight update: {index} has no 'weight_map' of parameter name -> shard file")
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        if Path(shard).name != shard or shard in ("", ".", ".."):
            raise ValueError(f"weight update: {index} names shard {shard!r}, not a file of its own directory")
    return shards


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
