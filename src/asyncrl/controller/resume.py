"""Checkpoints of a run and what a resume restores (``asyncrl train --resume RUN_DIR``).

Owns the on-disk layout of periodic checkpoints and the controller's share of them:

```
RUN_DIR/checkpoints/step-00000012/   Trainer.save_checkpoint (HF weights, optimizer, RNG, version)
                                     + ``extra`` = the controller snapshot below
```

The controller snapshot (plain values, stored as the trainer checkpoint's ``extra``) is taken on
the event-loop thread right after training step ``k - 1`` published version ``k``, with no
``await`` in between, so it is one consistent cut:

- ``step``: k, the next training step (equals the trainer's version);
- ``state``: the controller counters (trained tokens, drops, staleness histogram, RL wall time);
- ``gate``: ``accepted`` minus the groups still in the buffer (the groups trained so far): the
  staleness counters, restored so that admission after a resume obeys the same bound (the
  failure of AReaL after recovery was resetting them);
- ``source``: the prompt stream position (every prompt before it was admitted);
- ``readmit``: stream indices of prompts admitted but not finished-and-recorded at the cut
  (in flight or waiting in the buffer): they are admitted again, first, after a resume;
- ``offsets``: byte lengths of ``metrics.jsonl``, ``trajectories.jsonl`` and ``timeline.jsonl``.
  A resume cuts the files back to them: whatever happened after the cut (steps whose weights
  were lost with the kill, finished groups never trained) is undone, so the ledger never shows
  a sample trained twice, and every prompt admitted before the cut ends up re-admitted;
- ``adaptive``: the ``controller.adaptive`` policy's state (None when off);
- ``launcher``: the launcher's own values (``Controller``'s ``checkpoint_extra``).

``take_snapshot`` builds it from the controller's parts, ``restore_snapshot`` puts it back into
them, and ``save_checkpoint`` writes a checkpoint with it (``Controller`` calls the three).

A checkpoint directory appears atomically (``trainer.checkpoint.atomic_dir``): a kill during a
save leaves the previous one, which is then the resume point.

Which checkpoint a resume restores (``resume_checkpoint``): the newest one that verifies
(``verify_checkpoint``: every file matches the manifest written with it, and its trainer state and
controller snapshot read back). A newer one that does not is named with what is wrong, and moved to
``checkpoints/corrupt/`` (kept for inspection, never listed, pruned or deleted); the run resumes
from the previous one. ``controller.keep_checkpoints`` is at least 2 so that there is a previous one.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.controller.state import ControllerState
from asyncrl.data.prompts import PromptSource
from asyncrl.storage import DiskFull, with_run_dir
from asyncrl.trainer.checkpoint import TRAINER_STATE, read_trainer_state, verify_manifest
from asyncrl.types import Prompt

if TYPE_CHECKING:
    from asyncrl.controller.adaptive import AdaptiveAdmission
    from asyncrl.controller.staleness import StalenessGate
    from asyncrl.trainer.api import PolicyTrainer

CHECKPOINTS = "checkpoints"
CORRUPT = "corrupt"
SNAPSHOT_FORMAT = 1


class CheckpointError(RuntimeError):
    """A run has checkpoints but none of them can be resumed from (the message names each problem)."""


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    """Where the checkpoint taken before training step ``step`` lives."""
    return Path(run_dir) / CHECKPOINTS / f"step-{step:08d}"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of ``run_dir``, oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step-*") if p.is_dir() and (p / "trainer_state.pt").is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-", 1)[1]))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of ``run_dir`` (None: the run saved none yet)."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def prune_checkpoints(run_dir: str | Path, keep: int) -> None:
    """Remove all but the ``keep`` newest checkpoints, never fewer than 2 (a resume falls back to the
    previous one when the newest is damaged), and leftovers of interrupted saves."""
    found = list_checkpoints(run_dir)
    for old in found[: max(0, len(found) - max(2, keep))]:
        shutil.rmtree(old, ignore_errors=True)
    root = Path(run_dir) / CHECKPOINTS
    if root.is_dir():
        for tmp in root.glob(".step-*"):
            shutil.rmtree(tmp, ignore_errors=True)


def prompt_at(source: PromptSource, index: int) -> Prompt:
    """The prompt at position ``index`` of ``source``'s stream (the source's position is kept)."""
    saved = source.position
    source.position = index
    try:
        return source.next()
    finally:
        source.position = saved


def check_snapshot(snapshot: dict[str, Any]) -> dict[str, Any]:
    """Validate a controller snapshot read back from a checkpoint; returns it."""
    if not isinstance(snapshot, dict) or snapshot.get("format") != SNAPSHOT_FORMAT:
        raise ValueError("checkpoint has no controller snapshot of a supported format (was it saved by asyncrl train?)")
    for key in ("step", "state", "gate", "source", "readmit", "offsets"):
        if key not in snapshot:
            raise ValueError(f"controller snapshot lacks {key!r}")
    return snapshot


def take_snapshot(
    state: ControllerState,
    elapsed_s: float,
    trained_groups: int,
    adaptive: AdaptiveAdmission | None,
    source: PromptSource,
    readmit: list[int],
    offsets: dict[str, int],
    launcher: dict[str, Any],
) -> dict[str, Any]:
    """The controller snapshot (module docstring): ``trained_groups`` is the gate's ``accepted`` less the
    groups still buffered, ``readmit`` the prompts to admit again (a resume's not yet re-admitted, then
    the open ones), ``elapsed_s`` the RL time so far."""
    counters = state.to_dict()
    counters["rl_elapsed_s"] = elapsed_s
    return {
        "format": SNAPSHOT_FORMAT,
        "step": state.step,
        "state": counters,
        "gate": {"accepted": trained_groups},
        "adaptive": adaptive.state_dict() if adaptive is not None else None,
        "source": source.state_dict(),
        "readmit": readmit,
        "offsets": offsets,
        "launcher": launcher,
    }


def restore_snapshot(
    snapshot: dict[str, Any],
    trainer_version: int,
    gate: StalenessGate,
    adaptive: AdaptiveAdmission | None,
    source: PromptSource,
) -> tuple[ControllerState, list[int]]:
    """Put a snapshot back: the gate's counters, the adaptive policy, the prompt stream's position;
    returns the counters (one more resume, no stop reason) and the stream indices to admit again first.
    The trainer must already be at the snapshot's step (``trainer_version``)."""
    snap = check_snapshot(snapshot)
    step = int(snap["step"])
    if trainer_version != step:
        raise ValueError(f"resume: trainer is at version {trainer_version}, snapshot at step {step}")
    state = ControllerState.from_dict(snap["state"])
    state.step = step
    state.resumes += 1
    state.stop_reason = None
    gate.load_state_dict(snap["gate"])
    if adaptive is not None and snap.get("adaptive"):
        adaptive.load_state_dict(snap["adaptive"])
    source.load_state_dict(snap["source"])
    return state, [int(i) for i in snap["readmit"]]


async def save_checkpoint(
    executor: ThreadPoolExecutor,
    trainer: PolicyTrainer,
    run_dir: Path,
    snapshot: dict[str, Any],
    tokenizer: Any,
    keep: int,
) -> None:
    """The trainer's checkpoint with ``snapshot`` as its ``extra`` (on ``executor``), then the old ones
    pruned (``prune_checkpoints``). A full disk is re-raised naming the run (the trainer does not know it)."""
    path = checkpoint_dir(run_dir, int(snapshot["step"]))
    try:
        await asyncio.get_running_loop().run_in_executor(executor, trainer.save_checkpoint, path, snapshot, tokenizer)
    except DiskFull as exc:
        raise with_run_dir(exc, run_dir) from exc.__cause__
    prune_checkpoints(run_dir, keep)


def verify_checkpoint(path: str | Path) -> list[str]:
    """What is wrong with a checkpoint (empty: it can be resumed from): its files against its
    manifest (missing, truncated, changed, added, or no manifest), then its trainer state read back
    (memory-mapped: a few ms) with a controller snapshot in it."""
    problems = verify_manifest(path)
    if problems:
        return problems
    try:
        check_snapshot(read_trainer_state(path, mmap=True).get("extra"))
    except Exception as exc:  # noqa: BLE001 - whatever stops it from loading is the finding
        return [f"{TRAINER_STATE} unreadable ({type(exc).__name__}: {exc})"]
    return []


def _step_dirs(run_dir: str | Path) -> list[Path]:
    """Every ``step-*`` directory of the run, oldest first (complete or not)."""
    root = Path(run_dir) / CHECKPOINTS
    found = [p for p in root.glob("step-*") if p.is_dir()] if root.is_dir() else []
    return sorted(found, key=lambda p: int(p.name.split("-", 1)[1]))


def set_aside(path: Path) -> Path:
    """Move a damaged checkpoint to ``checkpoints/corrupt/<name>.<time>`` (never deleted); returns where."""
    root = path.parent / CORRUPT
    root.mkdir(exist_ok=True)
    target, n = root / f"{path.name}.{time.strftime('%Y%m%d-%H%M%S')}", 1
    while target.exists():
        target, n = root / f"{path.name}.{time.strftime('%Y%m%d-%H%M%S')}-{n}", n + 1
    path.rename(target)
    return target


def resume_checkpoint(run_dir: str | Path, report: Callable[[str], None] = print) -> Path | None:
    """The checkpoint a resume restores: the newest that verifies (``verify_checkpoint``). Each newer
    one is reported through ``report`` (its path and what is wrong) and set aside (``set_aside``).
    None: the run has no checkpoint (it starts over). Raises ``CheckpointError`` when it has some
    but none verifies (then nothing is moved)."""
    bad: list[tuple[Path, list[str]]] = []
    for ckpt in reversed(_step_dirs(run_dir)):
        problems = verify_checkpoint(ckpt)
        if problems:
            bad.append((ckpt, problems))
            continue
        for path, why in bad:
            moved = set_aside(path)
            report(
                f"checkpoint {path} is damaged: {'; '.join(why)}. It was moved to {moved}; the run resumes "
                f"from the previous checkpoint, {ckpt.name} (the steps after it are trained again)."
            )
        return ckpt
    if bad:
        details = "\n".join(f"  {path}: {'; '.join(why)}" for path, why in bad)
        raise CheckpointError(
            f"cannot resume {run_dir}: no checkpoint verifies\n{details}\nNothing was changed. Restore a "
            "checkpoint from a backup, or start a new run (--overwrite moves this one aside)."
        )
    return None
