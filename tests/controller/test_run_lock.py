"""One writer per run directory (``controller.run_lock``): a second holder is refused naming the first,
a lock whose process died is taken over, releasing removes the file, and a process that opened the file
before its removal does not end up holding a lock nobody else sees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.controller.run_lock import LOCK_NAME, RunDirLocked, RunLock

_HOLD = """
import sys, time
from asyncrl.controller.run_lock import RunLock
lock = RunLock(sys.argv[1])
print("held", flush=True)
sys.stdin.readline()  # hold until told (or killed), then release as a run does at its end
lock.release()
"""


def _holder(run_dir: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(run_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_is_refused_naming_the_holder(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _holder(run_dir)
    try:
        with pytest.raises(RunDirLocked) as err:
            RunLock(run_dir)
        message = str(err.value)
        assert f"pid {proc.pid}" in message and "in use by another asyncrl process" in message
        assert "\n" not in message
    finally:
        proc.communicate("\n", timeout=60)
    with RunLock(run_dir) as lock:  # its holder released and ended: free again, and nothing stale about it
        assert lock.held and lock.stale is None
    assert not (run_dir / LOCK_NAME).exists()


def test_a_lock_whose_process_was_killed_is_taken_over(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _holder(run_dir)
    proc.kill()
    proc.wait(timeout=60)
    assert (run_dir / LOCK_NAME).exists()  # a SIGKILL leaves the file
    lock = RunLock(run_dir)
    try:
        assert lock.stale is not None and lock.stale["pid"] == proc.pid
        note = lock.stale_note()
        assert note is not None and f"pid {proc.pid}" in note and "gone" in note
        assert json.loads((run_dir / LOCK_NAME).read_text())["pid"] == os.getpid()
    finally:
        lock.release()
        lock.release()  # idempotent
    assert not (run_dir / LOCK_NAME).exists()


def test_one_process_cannot_take_its_own_lock_twice(tmp_path: Path) -> None:
    with RunLock(tmp_path) as first:
        with pytest.raises(RunDirLocked, match=f"pid {os.getpid()}"):
            RunLock(tmp_path)
        assert first.held


def test_an_opened_file_removed_by_its_releaser_is_not_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A holder releases (removes the file) between a newcomer's open and its flock: the newcomer must
    see that the path now names another file and lock that one, not the removed inode."""
    first = RunLock(tmp_path)
    real_flock = __import__("fcntl").flock
    calls = {"n": 0}

    def flock_after_release(fd: int, op: int) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            first.release()  # the file this fd names is now unlinked
            Path(tmp_path / LOCK_NAME).write_text("{}")  # and someone else made a new one
        real_flock(fd, op)

    monkeypatch.setattr("asyncrl.controller.run_lock.fcntl.flock", flock_after_release)
    second = RunLock(tmp_path)
    try:
        assert calls["n"] == 2  # it tried again on the file the path names now
        assert os.fstat(second._fd).st_ino == os.stat(tmp_path / LOCK_NAME).st_ino  # type: ignore[arg-type]
    finally:
        second.release()


def test_a_directory_the_lock_made_goes_again_when_nothing_was_written(tmp_path: Path) -> None:
    with RunLock(tmp_path / "new"):
        assert (tmp_path / "new").is_dir()
    assert not (tmp_path / "new").exists()  # a run refused or failed before its first file leaves no trace
    with RunLock(tmp_path / "used"):
        (tmp_path / "used" / "config.yaml").write_text("x: 1\n")
    assert (tmp_path / "used" / "config.yaml").exists()
    (tmp_path / "mine").mkdir()
    with RunLock(tmp_path / "mine"):
        pass
    assert (tmp_path / "mine").is_dir()  # the user's own directory stays, empty or not
