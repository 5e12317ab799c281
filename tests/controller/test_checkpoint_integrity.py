"""Checkpoint integrity: the manifest written with every checkpoint, and a resume that falls back
from a damaged newest checkpoint to the previous one (``controller.resume.resume_checkpoint``)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.controller.resume import (
    CORRUPT,
    SNAPSHOT_FORMAT,
    CheckpointError,
    checkpoint_dir,
    list_checkpoints,
    prune_checkpoints,
    resume_checkpoint,
    verify_checkpoint,
)
from asyncrl.trainer.checkpoint import MANIFEST, TRAINER_STATE, atomic_dir, write_manifest, write_trainer_state


def _snapshot(step: int) -> dict:
    return {
        "format": SNAPSHOT_FORMAT,
        "step": step,
        "state": {},
        "gate": {},
        "source": {},
        "readmit": [],
        "offsets": {},
    }


def _save(run: Path, step: int) -> Path:
    """A checkpoint as ``Trainer.save_checkpoint`` lays it out (weights, a nested file, the state)."""
    path = checkpoint_dir(run, step)
    with atomic_dir(path) as tmp:
        (tmp / "model.safetensors").write_bytes(os.urandom(4096))
        (tmp / "adapter").mkdir()
        (tmp / "adapter" / "adapter_config.json").write_text("{}")
        write_trainer_state(tmp, {"version": step, "extra": _snapshot(step)})
    return path


def _truncate(path: Path) -> str:
    with open(path / "model.safetensors", "r+b") as fh:
        fh.truncate(1000)
    return "model.safetensors: 1000 bytes, 4096 when saved (truncated or overwritten)"


def _flip(path: Path) -> str:
    data = bytearray((path / TRAINER_STATE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (path / TRAINER_STATE).write_bytes(bytes(data))
    return f"{TRAINER_STATE}: SHA-256 differs from the one saved (its bytes changed)"


def _no_manifest(path: Path) -> str:
    (path / MANIFEST).unlink()
    return f"no {MANIFEST}"


def _missing_file(path: Path) -> str:
    (path / "adapter" / "adapter_config.json").unlink()
    return "adapter/adapter_config.json: missing"


def _added_file(path: Path) -> str:
    (path / "model.safetensors.index.json").write_text("{}")
    return "model.safetensors.index.json: not listed"


def _garbage_manifest(path: Path) -> str:
    (path / MANIFEST).write_text("{not json")
    return f"{MANIFEST} unreadable"


def _unreadable_state(path: Path) -> str:
    """Bytes that were never a trainer state, under a manifest that matches them."""
    (path / TRAINER_STATE).write_bytes(b"not a torch file")
    write_manifest(path)
    return f"{TRAINER_STATE} unreadable"


DAMAGE: dict[str, Callable[[Path], str]] = {
    "truncated": _truncate,
    "flipped_bytes": _flip,
    "no_manifest": _no_manifest,
    "missing_file": _missing_file,
    "added_file": _added_file,
    "garbage_manifest": _garbage_manifest,
    "unreadable_state": _unreadable_state,
}


def test_a_good_checkpoint_verifies_and_is_the_resume_point(tmp_path: Path) -> None:
    _save(tmp_path, 2)
    newest = _save(tmp_path, 4)
    manifest = json.loads((newest / MANIFEST).read_text())
    assert sorted(manifest["files"]) == ["adapter/adapter_config.json", "model.safetensors", TRAINER_STATE]
    assert manifest["files"]["model.safetensors"]["size"] == 4096
    assert verify_checkpoint(newest) == []
    said: list[str] = []
    assert resume_checkpoint(tmp_path, said.append) == newest and said == []
    assert resume_checkpoint(tmp_path / "no-run") is None  # nothing saved yet: the run starts over


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_newest_checkpoint_is_named_and_the_previous_one_used(tmp_path: Path, damage: str) -> None:
    previous = _save(tmp_path, 2)
    newest = _save(tmp_path, 4)
    expected = DAMAGE[damage](newest)
    said: list[str] = []
    assert resume_checkpoint(tmp_path, said.append) == previous
    assert len(said) == 1, said
    assert str(newest) in said[0] and expected in said[0], said[0]
    assert "resumes from the previous checkpoint, step-00000002" in said[0]
    moved = list((tmp_path / "checkpoints" / CORRUPT).iterdir())  # kept for inspection, no longer listed
    assert [p.name.split(".")[0] for p in moved] == ["step-00000004"] and not newest.exists()
    assert list_checkpoints(tmp_path) == [previous]
    said.clear()
    assert resume_checkpoint(tmp_path, said.append) == previous and said == []  # reported once


def test_no_checkpoint_verifies_stops_the_resume_and_moves_nothing(tmp_path: Path) -> None:
    for step, damage in ((2, _truncate), (4, _no_manifest)):
        damage(_save(tmp_path, step))
    with pytest.raises(CheckpointError, match="no checkpoint verifies") as err:
        resume_checkpoint(tmp_path)
    assert "step-00000002: model.safetensors" in str(err.value) and "step-00000004: no manifest" in str(err.value)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000002", "step-00000004"]


def test_a_failed_save_leaves_no_manifest_and_no_directory(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), atomic_dir(checkpoint_dir(tmp_path, 6)) as tmp:
        (tmp / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("killed mid-save")
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


def test_at_least_two_checkpoints_are_kept(tmp_path: Path) -> None:
    for step in (2, 4, 6):
        _save(tmp_path, step)
    prune_checkpoints(tmp_path, keep=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000004", "step-00000006"]
    with pytest.raises(ConfigError, match="controller.keep_checkpoints must be >= 2"):
        load_config(overrides=["controller.keep_checkpoints=1"])
