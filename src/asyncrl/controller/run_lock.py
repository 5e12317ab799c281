"""One writer per run directory: the lock a training run holds for its whole life, resumes included.

Owns ``RunLock``. The lock is an exclusive ``flock`` on ``RUN_DIR/.lock``, taken before anything
else is written into the directory and held until the run ends. The file holds who has it (pid,
host, start time, command line), so a second process is refused in one line that names the holder
(:class:`RunDirLocked`). The kernel drops a ``flock`` when its process dies, however it dies, so a
lock whose process is gone (a ``.lock`` file left by a killed run) is taken over: ``RunLock.stale``
says whose it was. The file is removed when the lock is released; a process that opened the old
file before the removal notices that the path now names another file and tries again, so two
holders can never both believe they own the directory. A directory the lock made is removed again
on release if nothing else was written into it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

LOCK_NAME = ".lock"


class RunDirLocked(Exception):
    """Another process holds the run directory's lock (the message names it)."""


def _describe(holder: dict[str, Any]) -> str:
    pid, host = holder.get("pid", "?"), holder.get("host", "?")
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)) if isinstance(started, int | float) else "?"
    return f"pid {pid} on {host}, started {when}: {holder.get('command', '?')}"


def _read_holder(path: Path) -> dict[str, Any]:
    try:
        holder = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


class RunLock:
    """The exclusive lock on one run directory (see the module docstring)."""

    def __init__(self, run_dir: str | Path) -> None:
        """Take the lock of ``run_dir`` (made if missing) or raise :class:`RunDirLocked`; an
        ``OSError`` (read-only or not a directory) propagates for the caller to word."""
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.stale: dict[str, Any] | None = None
        """The holder recorded by a process that died without releasing (None: there was none)."""
        self.created = not self.run_dir.exists()
        """This lock made the directory: releasing it removes the directory again if nothing else was
        written into it (a run refused or failed before its first file leaves no trace)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = _read_holder(self.path)
                raise RunDirLocked(
                    f"{self.run_dir} is in use by another asyncrl process ({_describe(holder)}); nothing "
                    f"was written. Wait for it to end, or stop it first (kill -TERM {holder.get('pid', 'PID')} "
                    "stops it after its current step, with a checkpoint)."
                ) from None
            except BaseException:
                os.close(fd)
                raise
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder released and removed the file after we opened it: take the new one
        self._fd: int | None = fd
        left = _read_holder(self.path)
        self.stale = left or None
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.time(),
            "command": " ".join(Path(sys.argv[0]).name if i == 0 else a for i, a in enumerate(sys.argv)),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def stale_note(self) -> str | None:
        """One line about a lock left by a process that is gone (None: there was none)."""
        if self.stale is None:
            return None
        return f"{self.run_dir} had been locked by a process that is gone ({_describe(self.stale)}); lock taken over"

    def release(self) -> None:
        """Remove the lock file and drop the lock, and the directory if this lock made it and it is
        empty (idempotent)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(fd)
        if self.created:
            with contextlib.suppress(OSError):  # not empty (the run wrote into it), or gone: keep it
                self.run_dir.rmdir()

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
