"""Checkpoint files: Hugging Face weights plus the training state, written atomically.

This module owns the on-disk format of ``Trainer.save_checkpoint`` (the trainer decides what
goes in, this module how it is stored):

```
DIR/
  config.json, generation_config.json, model.safetensors   Hugging Face weights (merged LoRA)
  tokenizer files                                           when a tokenizer was given
  adapter/adapter_model.safetensors, adapter_config.json   LoRA only: the trainable adapters
  trainer_state.pt                                          optimizer (parameter-name keyed),
                                                            LR schedule, version, RNG states of
                                                            every rank, the caller's ``extra``
```

``trainer_state.pt`` holds only tensors and plain Python values, so it loads with
``torch.load(weights_only=True)``. A checkpoint directory is written under a temporary name
and renamed into place: a crash mid-save leaves the previous checkpoint intact.
RNG states: Python ``random``, NumPy's global generator, torch CPU and every CUDA device.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

TRAINER_STATE = "trainer_state.pt"
FORMAT_VERSION = 1


def capture_rng() -> dict[str, Any]:
    """This process's RNG states (Python, NumPy, torch CPU, CUDA) as weights-only-safe values."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = (kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached))
    except ImportError:  # pragma: no cover - numpy ships with torch
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Undo ``capture_rng``."""
    random.setstate(_tuplify(state["python"]))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuplify(x: Any) -> Any:
    """``random.setstate`` wants tuples; a round trip through some loaders gives lists."""
    if isinstance(x, (list, tuple)):
        return tuple(_tuplify(v) for v in x)
    return x


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces ``path`` (old one removed)."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = final.parent / f".{final.name}.old-{os.getpid()}"
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)


def write_trainer_state(directory: Path, state: dict[str, Any]) -> None:
    torch.save({"format": FORMAT_VERSION, **state}, str(directory / TRAINER_STATE))


def read_trainer_state(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / TRAINER_STATE
    if not path.is_file():
        raise FileNotFoundError(f"{directory} is not a trainer checkpoint (no {TRAINER_STATE})")
    state = torch.load(str(path), map_location="cpu", weights_only=True)
    if state.get("format") != FORMAT_VERSION:
        raise ValueError(f"{path}: unsupported checkpoint format {state.get('format')!r}")
    return state


def read_hf_weights(directory: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a Hugging Face safetensors checkpoint (single file or sharded index)."""
    from safetensors.torch import load_file

    path = Path(directory)
    single = path / "model.safetensors"
    if single.is_file():
        return load_file(str(single))
    index = path / "model.safetensors.index.json"
    if index.is_file():
        out: dict[str, torch.Tensor] = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            out.update(load_file(str(path / shard)))
        return out
    raise FileNotFoundError(f"{path} holds no model.safetensors")
