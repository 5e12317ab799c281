"""``asyncrl.storage``: which failures are a full disk, the message the user sees, and the CLI's exit."""

from __future__ import annotations

import errno
import pickle
from pathlib import Path

import pytest

from asyncrl import cli, storage
from asyncrl.storage import DiskFull, disk_full, find_disk_full, is_disk_full, raise_disk_full, with_run_dir

TORCH_OPAQUE = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
"""What ``torch.save(obj, path)`` raised on a full tmpfs (torch 2.x): no errno, no hint."""
SAFETENSORS = RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")
"""The text of safetensors' ``SafetensorError`` on a full tmpfs."""


def _chained(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException:
            raise outer  # noqa: B904 - the implicit context is what is tested
    except BaseException as exc:
        return exc


def test_the_shapes_of_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert is_disk_full(SAFETENSORS)
    assert is_disk_full(_chained(RuntimeError("writer failed"), OSError(errno.ENOSPC, "x")))  # torch to a file object
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(ValueError("bad value"))
    # torch's opaque writer error counts only when the filesystem is (nearly) full
    assert not is_disk_full(TORCH_OPAQUE, tmp_path)
    monkeypatch.setattr(storage, "free_bytes", lambda path: 4096)
    assert is_disk_full(TORCH_OPAQUE, tmp_path)
    assert not is_disk_full(TORCH_OPAQUE)  # no path: not guessed


def test_the_message_names_the_file_says_full_and_how_to_resume(tmp_path: Path) -> None:
    err = disk_full(
        tmp_path / "metrics.jsonl",
        OSError(errno.ENOSPC, "No space left on device"),
        kept="Every line written before it is kept.",
        run_dir=tmp_path,
    )
    text = str(err)
    assert text.startswith(f"disk full: writing {tmp_path / 'metrics.jsonl'} failed (No space left on device; ")
    assert "free there now" in text and "Every line written before it is kept." in text
    assert text.endswith(f"then resume the run: asyncrl train --resume {tmp_path}")
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC and err.filename == str(tmp_path / "metrics.jsonl")
    again = pickle.loads(pickle.dumps(err))  # crosses the trainer process's pipe and Ray intact
    assert type(again) is DiskFull and str(again) == text and again.filename == err.filename
    generic = disk_full(tmp_path / "ckpt", kept="Discarded.")
    assert str(generic).endswith("asyncrl train --resume RUN_DIR")
    assert str(with_run_dir(generic, tmp_path / "run")).endswith(f"asyncrl train --resume {tmp_path / 'run'}")


def test_raise_disk_full_converts_only_a_full_disk(tmp_path: Path) -> None:
    with pytest.raises(DiskFull, match="disk full: writing .*model.safetensors") as info:
        with raise_disk_full(tmp_path, kept="k."):
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "model.safetensors"))
    assert isinstance(info.value.__cause__, OSError)  # the original error stays attached
    with pytest.raises(PermissionError):
        with raise_disk_full(tmp_path, kept="k."):
            raise PermissionError(errno.EACCES, "Permission denied")
    assert find_disk_full(_chained(RuntimeError("an episode failed"), info.value)) is info.value
    assert find_disk_full(RuntimeError("x")) is None


def test_the_cli_prints_the_message_not_a_traceback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    full = disk_full(tmp_path / "trajectories.jsonl", kept="Kept.", run_dir=tmp_path)

    def cmd_train(args: object) -> int:
        raise _chained(RuntimeError("an episode failed"), full)  # how the loop wraps a failed writer task

    monkeypatch.setattr(cli.train, "run", cmd_train)
    assert cli.main(["train", "--run-dir", str(tmp_path / "new")]) == 1
    err = capsys.readouterr().err
    assert err == f"asyncrl: {full}\n" and "Traceback" not in err
