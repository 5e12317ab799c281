"""A full disk, as a run reports it: the error a failed write becomes, and how it is recognised.

Owns ``DiskFull`` (an ``OSError`` with errno ENOSPC whose message names the file, says the disk is
full, what was kept, and how to resume once space is freed), ``is_disk_full`` (the shapes a full
disk takes on the way up: ``OSError`` ENOSPC/EDQUOT, safetensors' "No space left on device (os error
28)", an error whose cause or context is one of those, and torch's opaque ``inline_container``
writer errors when the filesystem has no space left), ``disk_full`` (builds the error), and
``raise_disk_full`` (a context manager turning a disk-full failure of the block into ``DiskFull``).

The writers of a run (``controller.rundir`` for the jsonl files, ``trainer.state`` for checkpoints)
raise ``DiskFull`` at the first failed write; ``find_disk_full`` digs it out of a wrapped error for
the CLI. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
from collections.abc import Iterator
from pathlib import Path

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXT = ("no space left on device", "disk quota exceeded", "os error 28", "os error 122")
_TORCH_WRITER_TEXT = ("inline_container", "pytorchstreamwriter", "file write failed")
LOW_SPACE_BYTES = 1 << 20
"""An opaque torch writer error counts as a full disk when less than this is left."""
RESUME_HINT = "Free space on that filesystem, then resume the run: asyncrl train --resume {run_dir}"


class DiskFull(OSError):
    """A write failed because the disk (or the user's quota) is full; ``str()`` is the whole message,
    ``filename`` the file (or checkpoint directory) whose write failed."""

    def __str__(self) -> str:
        return str(self.strerror)


def free_bytes(path: str | Path) -> int | None:
    """Bytes free on the filesystem holding ``path`` (its nearest existing ancestor); None if unknown."""
    p = Path(path).absolute()
    for candidate in (p, *p.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def human_bytes(n: float) -> str:
    """``n`` bytes as ``1.5 GiB`` (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - the loop returns


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        cur = todo.pop()
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        yield cur
        todo += [cur.__cause__, cur.__context__]


def is_disk_full(exc: BaseException, path: str | Path | None = None) -> bool:
    """Whether ``exc`` (or its cause or context) is a write that failed for want of space. ``path``:
    where it was writing; an opaque torch writer error counts when that filesystem is (nearly) full."""
    for cur in _chain(exc):
        if isinstance(cur, OSError) and cur.errno in DISK_FULL_ERRNOS:
            return True
        text = str(cur).lower()
        if any(t in text for t in _DISK_FULL_TEXT):
            return True
        if path is not None and isinstance(cur, RuntimeError) and any(t in text for t in _TORCH_WRITER_TEXT):
            free = free_bytes(path)
            if free is not None and free < LOW_SPACE_BYTES:
                return True
    return False


def find_disk_full(exc: BaseException) -> DiskFull | None:
    """The ``DiskFull`` in ``exc``'s chain of causes and contexts (None: it is not a full disk)."""
    return next((cur for cur in _chain(exc) if isinstance(cur, DiskFull)), None)


def _reason(exc: BaseException | None) -> str:
    for cur in _chain(exc) if exc is not None else ():
        if isinstance(cur, OSError) and cur.errno in DISK_FULL_ERRNOS:
            return cur.strerror or "No space left on device"
    return "No space left on device"


def disk_full(
    path: str | Path, cause: BaseException | None = None, *, kept: str, run_dir: str | Path | None = None
) -> DiskFull:
    """The error for a write to ``path`` that failed for want of space. ``kept``: what the user still
    has (one sentence); ``run_dir``: the run to resume (None: the hint names ``RUN_DIR``)."""
    free = free_bytes(path)
    left = f"{human_bytes(free)} free there now" if free is not None else "free space unknown"
    hint = RESUME_HINT.format(run_dir=run_dir if run_dir is not None else "RUN_DIR")
    message = f"disk full: writing {path} failed ({_reason(cause)}; {left}). {kept} {hint}"
    return DiskFull(errno.ENOSPC, message, str(path))


def with_run_dir(exc: DiskFull, run_dir: str | Path) -> DiskFull:
    """``exc`` with its resume hint naming ``run_dir`` (raised by a writer that did not know the run)."""
    generic = RESUME_HINT.format(run_dir="RUN_DIR")
    text = str(exc)
    if not text.endswith(generic):
        return exc
    out = DiskFull(exc.errno, text[: -len(generic)] + RESUME_HINT.format(run_dir=run_dir), exc.filename)
    out.__cause__ = exc.__cause__
    return out


@contextlib.contextmanager
def raise_disk_full(path: str | Path, *, kept: str, run_dir: str | Path | None = None) -> Iterator[None]:
    """Run the block; a disk-full failure in it (see ``is_disk_full``; ``path`` is where it writes)
    is raised as ``DiskFull`` (the original error as its cause); other errors pass unchanged."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as exc:
        if not is_disk_full(exc, path):
            raise
        filename = next(
            (c.filename for c in _chain(exc) if isinstance(c, OSError) and c.filename), None
        )  # the exact file where the OS says which
        raise disk_full(filename or path, exc, kept=kept, run_dir=run_dir) from exc
