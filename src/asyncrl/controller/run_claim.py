"""One run per run directory (DESIGN §7): run ids, claiming a directory for a new run, and the check
readers make before trusting its lines.

A run directory is one run. Every line of the jsonl files (``JSONL_FILES``), and ``summary.json``, carries
the run's ``run_id`` (made when the run starts, kept by its resumes). ``claim_run_dir`` refuses
to start a new run in a directory that already holds one (unless asked to move the old run aside
to ``<dir>.old-<time>``: nothing is ever deleted), and ``check_one_run`` refuses a directory whose
lines come from more than one run (e.g. written by a version without the guard), which readers
(``asyncrl report``, the benches) call before trusting anything in it; ``read_jsonl`` reads the
complete lines of one file. The writer of those files is ``controller.rundir.RunDir``.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from pathlib import Path
from typing import Any

from asyncrl.controller.run_lock import LOCK_NAME

JSONL_FILES = ("metrics.jsonl", "trajectories.jsonl", "timeline.jsonl", "snapshots.jsonl")


RUN_MARKERS = (
    "config.yaml",
    "metrics.jsonl",
    "trajectories.jsonl",
    "timeline.jsonl",
    "summary.json",
    "checkpoints",
    "checkpoint",
)
"""Names whose presence means a directory already holds (part of) a run."""
_RUN_ID = re.compile(rb'"run_id": "([^"\\]*)"')


class RunDirError(Exception):
    """A run directory cannot be used as asked; the message says what to do instead."""


class RunDirInUse(RunDirError):
    """A new run was asked to write into a directory that already holds a run."""


class MixedRunDir(RunDirError):
    """A directory whose files hold lines of more than one run."""


def new_run_id() -> str:
    """A fresh run id: start time and 32 random bits (``20261130-170512-1f2e3d4c``)."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"


def _unique(path: Path) -> Path:
    out, n = path, 1
    while out.exists() or out.is_symlink():
        out, n = path.with_name(f"{path.name}-{n}"), n + 1
    return out


def default_run_dir(root: str = "runs") -> Path:
    """``runs/<timestamp>``, with a ``-N`` suffix where a run started in the same second."""
    return _unique(Path(root) / time.strftime("%Y%m%d-%H%M%S"))


def fresh_subdir(root: str | Path) -> Path:
    """Make and return a new ``root/<timestamp>[-N]`` directory (one per bench invocation, so that
    two invocations never share a run directory, even when started in the same second)."""
    Path(root).mkdir(parents=True, exist_ok=True)
    while True:
        path = default_run_dir(str(root))
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def holds_run(path: str | Path) -> list[str]:
    """The names in ``path`` that belong to a run (empty: missing, empty or unrelated directory)."""
    p = Path(path)
    if not p.is_dir():
        return []
    return [name for name in RUN_MARKERS if (p / name).exists()]


def move_aside(path: str | Path, keep: tuple[str, ...] = ()) -> Path:
    """Move what ``path`` holds into a new sibling ``<name>.old-<timestamp>`` and return it (never
    deletes). The names in ``keep`` (the lock of the process moving it) stay where they are."""
    p = Path(path)
    target = _unique(p.with_name(f"{p.name}.old-{time.strftime('%Y%m%d-%H%M%S')}"))
    target.mkdir()
    for entry in p.iterdir():
        if entry.name not in keep:
            entry.rename(target / entry.name)
    return target


def claim_run_dir(path: str | Path, *, resume: bool = False, overwrite: bool = False) -> Path | None:
    """Check ``path`` before a run writes anything into it; returns where ``overwrite`` moved an
    old run (None when nothing was moved).

    A new run (``resume=False``) needs a directory that holds no run: otherwise it raises
    :class:`RunDirInUse` naming the three ways out, or, with ``overwrite``, moves the old run
    aside to ``<path>.old-<timestamp>`` first. A resume needs a directory holding one run."""
    p = Path(path)
    if resume:
        if overwrite:
            raise RunDirError("--overwrite starts a new run; it cannot be combined with --resume")
        if not p.is_dir():
            raise FileNotFoundError(f"cannot resume: {p} is not a run directory")
        check_one_run(p)
        return None
    found = holds_run(p)
    if not found:
        return None
    if overwrite:
        return move_aside(p, keep=(LOCK_NAME,))
    raise RunDirInUse(
        f"{p} already holds a run ({', '.join(found)}); nothing was written. Either\n"
        f"  - continue that run:          asyncrl train --resume {p}\n"
        f"  - choose another directory:   --run-dir NEW_DIR (or no --run-dir: runs/<timestamp>)\n"
        f"  - or start over in {p}: add --overwrite (the old run is moved aside to "
        f"{p}.old-<timestamp>, never deleted)"
    )


def _ids_in(path: Path) -> set[str | None]:
    """The run ids of the lines of one jsonl file (None for lines without one)."""
    ids: set[str | None] = set()
    if not path.is_file():
        return ids
    with open(path, "rb") as fh:
        for raw in fh:
            if not raw.strip():
                continue
            m = _RUN_ID.search(raw)
            ids.add(m.group(1).decode() if m else None)
    return ids


def run_ids(path: str | Path) -> set[str | None]:
    """Every run id found in the run directory's jsonl files and ``summary.json`` (None stands
    for lines written without one, by a version before run ids)."""
    p = Path(path)
    ids: set[str | None] = set()
    for name in JSONL_FILES:
        ids |= _ids_in(p / name)
    summary = p / "summary.json"
    if summary.is_file():
        try:
            ids.add(json.loads(summary.read_text()).get("run_id"))
        except (json.JSONDecodeError, AttributeError):
            pass
    return ids


def check_one_run(path: str | Path, ids: set[str | None] | None = None) -> str | None:
    """The run id of ``path`` (None: no lines yet, or written before run ids); raises
    :class:`MixedRunDir` where its files hold lines of more than one run: different run ids, or
    training steps in ``metrics.jsonl`` that start again (two runs without ids). ``ids``: the
    result of ``run_ids(path)`` where the caller has it already."""
    p = Path(path)
    ids = run_ids(p) if ids is None else ids
    if len(ids) > 1:
        named = sorted(str(i) if i is not None else "(no id)" for i in ids)
        raise MixedRunDir(
            f"{p} mixes {len(ids)} runs (run ids {', '.join(named)}): its metrics, ledger and summary "
            "cannot be trusted. Use a directory per run (asyncrl train refuses a directory that holds "
            "a run unless --resume or --overwrite)."
        )
    steps = [m.get("step") for m in read_jsonl(p / "metrics.jsonl")]
    for prev, cur in zip(steps, steps[1:], strict=False):
        if isinstance(prev, int) and isinstance(cur, int) and cur <= prev:
            raise MixedRunDir(
                f"{p}/metrics.jsonl goes from step {prev} back to step {cur}: it holds more than one run "
                "(written without run ids). Use a directory per run."
            )
    return next(iter(ids), None)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All complete JSON lines of a file (a torn last line from a kill is skipped)."""
    out = []
    p = Path(path)
    if not p.exists():
        return out
    for raw in p.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(raw))
        except json.JSONDecodeError:
            continue
    return out
