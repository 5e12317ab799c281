"""``Trainer.save_checkpoint`` on a full disk (issue 14 item 4): ENOSPC injected at the first write of a
checkpoint (the safetensors weights), at the training state (``torch.save``, whose error on a full disk
says only "unexpected pos") and at the manifest ``atomic_dir`` writes last. Each time:
``storage.DiskFull`` naming the checkpoint, no partial checkpoint directory left, the previous
checkpoint byte-identical and loadable; once space is back the same save succeeds. Also the trainer
process passes the error through as itself."""

from __future__ import annotations

import errno
import multiprocessing as mp
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

from asyncrl import storage
from asyncrl.launch.trainer_process import TrainerProcess
from asyncrl.storage import DiskFull, disk_full
from asyncrl.trainer import checkpoint
from asyncrl.trainer.checkpoint import read_trainer_state
from asyncrl.types import TrainBatch
from tests.trainer.synthetic import make_samples
from tests.trainer.test_state import _trained


def _files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _safetensors_full(tensors: Any, filename: str, metadata: Any = None) -> None:
    Path(filename).write_bytes(b"\x00" * 64)  # part of the file reached the disk
    raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")  # its text


def _torch_full(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
    Path(f).write_bytes(b"PK\x03\x04")
    raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")  # its text


def _manifest_full(directory: Any) -> None:
    raise OSError(errno.ENOSPC, "No space left on device", str(Path(directory) / "manifest.json"))


@pytest.mark.parametrize("where", ["weights", "trainer_state", "manifest"])
def test_a_checkpoint_on_a_full_disk(
    tiny_policy_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    trainer = _trained(tiny_policy_dir)
    root = tmp_path / "checkpoints"
    trainer.save_checkpoint(root / "step-00000001", extra={"step": 1})
    good = _files(root / "step-00000001")
    trainer.train_step(TrainBatch(tuple(make_samples(6, seed=2)), 1))
    with monkeypatch.context() as m:
        if where == "weights":
            m.setattr(safetensors.torch, "save_file", _safetensors_full)
        elif where == "manifest":  # written by atomic_dir after every other file
            m.setattr(checkpoint, "write_manifest", _manifest_full)
        else:
            m.setattr(torch, "save", _torch_full)
            m.setattr(storage, "free_bytes", lambda path: 0)  # what the full filesystem reports
        with pytest.raises(DiskFull) as info:
            trainer.save_checkpoint(root / "step-00000002", extra={"step": 2})
    text = str(info.value)
    written = root / ("step-00000002" if where != "manifest" else ".step-00000002.tmp-*/manifest.json")
    assert text.startswith(f"disk full: writing {root}/") and "failed (No space left on device;" in text
    assert Path(text.split()[3]).match(str(written))
    assert f"The half-written checkpoint {root / 'step-00000002'} was discarded" in text
    assert "then resume the run: asyncrl train --resume" in text
    assert sorted(p.name for p in root.iterdir()) == ["step-00000001"]  # nothing partial, no temporary
    assert _files(root / "step-00000001") == good
    assert trainer.load_checkpoint(root / "step-00000001") == {"step": 1}
    trainer.train_step(TrainBatch(tuple(make_samples(6, seed=2)), 1))  # space is back: the save succeeds
    trainer.save_checkpoint(root / "step-00000002", extra={"step": 2})
    assert read_trainer_state(root / "step-00000002")["version"] == 2


def test_the_trainer_process_raises_disk_full_as_itself(tmp_path: Path) -> None:
    parent, child = mp.Pipe()
    proc = TrainerProcess.__new__(TrainerProcess)  # the reply side only: no child process is started
    proc._conn, proc._version = parent, 0
    full = disk_full(tmp_path / "ckpt", kept="Discarded.")
    child.send(("disk_full", (full.errno, str(full), full.filename)))  # what the child sends
    with pytest.raises(DiskFull) as info:
        proc._reply("save_checkpoint")
    assert str(info.value) == str(full) and info.value.errno == errno.ENOSPC and info.value.filename == full.filename
