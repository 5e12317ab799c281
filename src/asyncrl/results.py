"""Result files: never an overwritten one.

Owns how a result file is written (a benchmark's ``--json`` and the plot beside it, ``benchmarks/``; a cost
profile; a simulator's sweep), so that no measurement is ever lost to a later one:

- ``check_result_path`` at the start of an invocation, before minutes of work: a result file (or its plot)
  that already exists is refused in one line naming it, and so is a folder this user cannot write;
- ``write_result`` at the end: the content goes to a scratch file in the same folder, then is linked to its
  name only if that name is still free (``os.link`` never replaces; without hard links, an exclusive
  create). A file that appeared meanwhile (a second bench given the same ``--json``) is kept, and this
  result is written beside it (``out.json`` -> ``out.1.json``), saying so on stderr: no result is lost;
- ``replace_result`` for ``--reanalyse FILE``, which asks for that file to be recomputed: the new analysis
  takes the name, the previous one is kept beside it (``out.old-<timestamp>.json``), never deleted.

No torch; no asyncrl module but ``config`` (the error is a ``ConfigError``: the CLI prints it in one
line and exits 2).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from asyncrl.config import ConfigError

__all__ = [
    "ResultFileError",
    "check_result_path",
    "replace_result",
    "write_result",
    "write_text_result",
    "write_with_plot",
]


class ResultFileError(ConfigError):
    """A bench result file that would replace an existing one, or that cannot be written where asked."""


def check_result_path(path: str | Path, *, beside: Sequence[str] = ()) -> None:
    """Refuse, before any work, a result file ``path`` that exists (or a file ``beside`` it: the suffixes of
    what the bench writes next to it, such as ``.png``), or whose folder cannot be made or written."""
    target = Path(path)
    for suffix in ("", *beside):
        taken = target.with_suffix(suffix) if suffix else target
        if taken.exists() or taken.is_symlink():
            what = "" if taken == target else f" (written beside --json {target})"
            raise ResultFileError(
                f"bench result file {taken}{what} already exists; a bench never replaces a result: give --json a "
                f"new name, or move {taken} away first"
            )
    blocking = next((f for f in (target.parent, *target.parent.parents) if f.exists() and not f.is_dir()), None)
    if blocking is not None:
        raise ResultFileError(
            f"cannot write bench result file {target}: {blocking} is a file, not a folder; choose another --json path"
        )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=target.parent, prefix=".asyncrl-write-check-"):
            pass
    except OSError as exc:
        raise ResultFileError(
            f"cannot write bench result file {target}: {exc.strerror or exc} ({target.parent}); choose a folder "
            "this user can write"
        ) from exc


def _numbered(target: Path, label: str) -> Path:
    return target.with_name(f"{target.stem}.{label}{target.suffix}")


def _link_new(source: Path, name: Path) -> bool:
    """Give ``source``'s content the new name ``name``; False (nothing done) if ``name`` exists."""
    try:
        os.link(source, name)
        return True
    except FileExistsError:
        return False
    except OSError:  # a filesystem without hard links: an exclusive create, then the bytes
        pass
    try:
        with open(name, "xb") as out:
            out.write(source.read_bytes())
        return True
    except FileExistsError:
        return False


def _scratch(target: Path) -> Path:
    """A scratch name beside ``target`` with its suffix (matplotlib reads the format from it)."""
    return target.with_name(f".{target.stem}.{uuid.uuid4().hex[:12]}.partial{target.suffix}")


def write_result(path: str | Path, write: Callable[[Path], object]) -> Path:
    """``write(scratch)`` fills a scratch file, which then takes the name ``path`` if no file holds it yet,
    else the first free ``<stem>.N<suffix>`` beside it (said on stderr); returns the path written."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = _scratch(target)
    try:
        write(scratch)
        written, n = target, 0
        while not _link_new(scratch, written):
            n += 1
            written = _numbered(target, str(n))
    finally:
        scratch.unlink(missing_ok=True)
    if written != target:
        print(
            f"asyncrl: bench result file {target} was written by another process while this bench ran; it is kept, "
            f"and this result is in {written}",
            file=sys.stderr,
            flush=True,
        )
    return written


def write_text_result(path: str | Path, text: str) -> Path:
    """``write_result`` of a text (a JSON dump)."""
    return write_result(path, lambda scratch: scratch.write_text(text))


def replace_result(path: str | Path, write: Callable[[Path], object]) -> Path:
    """``--reanalyse``: ``write(scratch)`` fills a scratch file that then replaces ``path`` in one rename; the
    previous file is first given the name ``<stem>.old-<timestamp><suffix>`` beside it (said on stdout),
    so nothing is lost. Returns ``path``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = _scratch(target)
    try:
        write(scratch)
        if target.exists():
            stamp = time.strftime("%Y%m%d-%H%M%S")
            kept, n = _numbered(target, f"old-{stamp}"), 0
            while not _link_new(target, kept):
                n += 1
                kept = _numbered(target, f"old-{stamp}-{n}")
            print(f"bench: the previous {target} is kept as {kept}", flush=True)
        os.replace(scratch, target)
    finally:
        scratch.unlink(missing_ok=True)
    return target


def write_with_plot(path: str | Path, text: str, plot: Callable[[Path], object], *, replace: bool = False) -> Path:
    """The JSON ``text`` at ``path`` and ``plot(png)`` beside the file written (its ``.png``), each by
    ``write_result`` (``replace``: ``replace_result``, for ``--reanalyse``); prints both; returns the JSON's path."""
    save = replace_result if replace else write_result
    written = save(path, lambda scratch: scratch.write_text(text))
    png = save(written.with_suffix(".png"), plot)
    print(f"\nwrote {written} and {png}", flush=True)
    return written
