"""The training service's checkpoints and training runs on disk, and their ``tinker://`` paths.

Layout under the service's root directory (``asyncrl serve training --root DIR``)::

    runs/<run id>/run.json                       the training run: base model, LoRA config, metadata
    runs/<run id>/weights/<name>/                 a training checkpoint (``save_weights``): trained
                                                  tensors + optimizer state + meta.json
    runs/<run id>/sampler_weights/<name>/         a sampler checkpoint (``save_weights_for_sampler``):
                                                  the merged model as ``model.safetensors`` + meta.json

A checkpoint's path is ``tinker://<run id>/weights/<name>`` (resp. ``sampler_weights``), the form the
client parses (``ParsedCheckpointTinkerPath``); the run id is the model id. Every checkpoint directory
is written whole or not at all (:func:`asyncrl.trainer.checkpoint.atomic_dir`), so a service killed
mid-save leaves the previous checkpoints intact, and a restarted service finds every run and
checkpoint again from these files alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from asyncrl.trainer.checkpoint import atomic_dir

__all__ = ["CheckpointRef", "CheckpointStore", "Kind"]

Kind = Literal["weights", "sampler_weights"]
KIND_TYPE = {"weights": "training", "sampler_weights": "sampler"}
"""Path segment -> the client's ``checkpoint_type``."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_RUN = re.compile(r"[A-Za-z0-9][A-Za-z0-9:._-]{0,200}")


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(frozen=True)
class CheckpointRef:
    """A parsed ``tinker://`` checkpoint path."""

    run_id: str
    kind: Kind
    name: str

    @property
    def tinker_path(self) -> str:
        return f"tinker://{self.run_id}/{self.kind}/{self.name}"


def check_name(name: str) -> str:
    """A checkpoint name as the client gives it: letters, digits, ``._-`` (no path separators)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise ValueError(f"checkpoint name {name!r} must be 1-128 of letters, digits, '.', '_' or '-'")
    return name


class CheckpointStore:
    """Training runs and checkpoints under one root directory (see the module docstring)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        (self.root / "runs").mkdir(parents=True, exist_ok=True)

    def run_dir(self, run_id: str) -> Path:
        if not _RUN.fullmatch(run_id) or ".." in run_id:
            raise ValueError(f"bad training run id {run_id!r}")
        return self.root / "runs" / run_id

    def parse(self, path: str) -> CheckpointRef:
        """A ``tinker://<run>/<weights|sampler_weights>/<name>`` path; ``ValueError`` naming what is wrong."""
        if not isinstance(path, str) or not path.startswith("tinker://"):
            raise ValueError(f"checkpoint path {path!r} is not a tinker:// path")
        parts = path[len("tinker://") :].split("/")
        if len(parts) != 3 or parts[1] not in KIND_TYPE:
            raise ValueError(f"checkpoint path {path!r} is not tinker://<run>/<weights|sampler_weights>/<name>")
        self.run_dir(parts[0])
        return CheckpointRef(parts[0], parts[1], check_name(parts[2]))  # type: ignore[arg-type]

    def directory(self, ref: CheckpointRef) -> Path:
        return self.run_dir(ref.run_id) / ref.kind / ref.name

    def existing(self, path: str) -> tuple[CheckpointRef, Path]:
        """The checkpoint a path names; ``FileNotFoundError`` when there is none."""
        ref = self.parse(path)
        directory = self.directory(ref)
        if not (directory / "meta.json").is_file():
            raise FileNotFoundError(f"no checkpoint {path}")
        return ref, directory

    # ------------------------------------------------------------------------------ runs
    def write_run(self, run_id: str, record: dict[str, Any]) -> None:
        directory = self.run_dir(run_id)
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / "run.json.tmp"
        tmp.write_text(json.dumps(record, indent=2))
        tmp.replace(directory / "run.json")

    def read_run(self, run_id: str) -> dict[str, Any]:
        file = self.run_dir(run_id) / "run.json"
        if not file.is_file():
            raise FileNotFoundError(f"no training run {run_id!r}")
        return json.loads(file.read_text())

    def run_ids(self) -> list[str]:
        runs = self.root / "runs"
        return sorted(p.name for p in runs.iterdir() if (p / "run.json").is_file())

    # ------------------------------------------------------------------------------ checkpoints
    @contextmanager
    def writing(self, ref: CheckpointRef, *, overwrite: bool, meta: dict[str, Any]) -> Iterator[Path]:
        """A fresh directory for a checkpoint; ``meta.json`` is added and the whole directory replaces
        any old one at the end (``FileExistsError`` for an existing name without ``overwrite``)."""
        final = self.directory(ref)
        if (final / "meta.json").exists() and not overwrite:
            raise FileExistsError(f"checkpoint {ref.tinker_path} exists (pass overwrite=True to replace it)")
        with atomic_dir(final) as tmp:
            yield tmp
            (tmp / "meta.json").write_text(json.dumps({**meta, "time": now_iso()}, indent=2))

    def meta(self, ref: CheckpointRef) -> dict[str, Any]:
        return json.loads((self.directory(ref) / "meta.json").read_text())

    def checkpoints(self, run_id: str) -> list[dict[str, Any]]:
        """The client's ``Checkpoint`` records of one run, oldest first (ephemeral sampler saves left out)."""
        out = []
        for kind in KIND_TYPE:
            base = self.run_dir(run_id) / kind
            if not base.is_dir():
                continue
            for directory in base.iterdir():
                if directory.name.startswith(".") or not (directory / "meta.json").is_file():
                    continue
                meta = json.loads((directory / "meta.json").read_text())
                if meta.get("ephemeral"):
                    continue
                ref = CheckpointRef(run_id, kind, directory.name)  # type: ignore[arg-type]
                out.append(
                    {
                        "checkpoint_id": f"{kind}/{directory.name}",
                        "checkpoint_type": KIND_TYPE[kind],
                        "time": meta["time"],
                        "tinker_path": ref.tinker_path,
                        "size_bytes": sum(f.stat().st_size for f in directory.iterdir() if f.is_file()),
                        "user_metadata": meta.get("user_metadata"),
                    }
                )
        return sorted(out, key=lambda c: c["time"])
