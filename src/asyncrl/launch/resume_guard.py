"""What a resume refuses: a changed run, a torn file, a run whose trained steps it would throw away.

Owns the checks ``asyncrl train --resume RUN_DIR`` makes before it changes anything in the directory:

- ``check_config_changes``: the config a resume runs with against the run's saved ``config.yaml``.
  Three kinds of keys:
  - ``FREE_KEYS`` change freely: how long the run goes on (``controller.total_steps``,
    ``controller.max_rl_time_s``), how often it evaluates, snapshots and checkpoints, what it prints
    and how many threads and workers it uses;
  - the keys that define the run (``FIXED_PREFIXES``/``FIXED_KEYS``: the model and its warm start, the
    task and its data, the seeds, the group and batch sizes, the staleness bound and how it is set) never
    change: the ledger's prompt stream, its groups and its staleness budget are counted in them, and the
    prompts in flight at the checkpoint are admitted again by their place in that stream. A run that
    wants others starts anew from the checkpoint's weights (the message says how);
  - every other key (learning rate, objective, sampling, rewards, evaluation, ...) changes only when
    named with ``--allow-change KEY`` (a section, e.g. ``trainer``, names all of its keys but those that
    define the run; naming one of those, or a whole section of them, is refused).
  What changed is returned (and recorded in the ledger's ``resumed`` line by the caller).
- ``check_offsets``: each jsonl file must reach the byte offset the checkpoint recorded and hold a
  whole line there; a file cut shorter (or mid-line) would lose the lines the checkpoint counts on.
- ``check_not_finished``: a run that ended by reaching its step count is not resumed at that count
  (nothing to train; its summary and final model stay as they are).
- ``check_restartable``: a run with no checkpoint to resume from is started over in place only when
  it never finished a training step; otherwise its trained steps (or its final model) would be lost.

Each refusal is a :class:`ResumeRefused` whose message says what was found and what to do instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asyncrl.config import Config, to_dict
from asyncrl.controller.resume import latest_checkpoint
from asyncrl.controller.run_claim import RunDirError

FREE_KEYS = frozenset(
    {
        "controller.total_steps",
        "controller.max_rl_time_s",
        "controller.eval_every",
        "controller.snapshot_every_s",
        "controller.checkpoint_every",
        "controller.keep_checkpoints",
        "run.progress",
        "run.torch_threads",
        "run.run_dir",
        "reward.num_workers",
        "launch.ray_address",
        "launch.ray_num_cpus",
        "launch.startup_timeout_s",
    }
)
"""Keys a resume may change without being asked: duration, logging and checkpoint cadence, resources."""

FIXED_PREFIXES = ("model.", "task.", "sft.")
"""Sections that define the run: the starting model, its warm start, the prompts."""

FIXED_KEYS = frozenset(
    {
        "run.seed",
        "rollout.group_size",
        "rollout.workflow",
        "controller.batch_size",
        "controller.max_staleness",
        "controller.fixed_lag",
        "controller.adaptive",
    }
)
"""Single keys that define the run: the seed, the group and batch sizes, the staleness bound and the
admission rules the ledger's staleness budget is replayed under."""


class ResumeRefused(RunDirError):
    """A resume that would lose, repeat or mislabel training data; nothing was changed."""


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, f"{name}."))
        else:
            out[name] = value
    return out


def is_fixed(key: str) -> bool:
    """Whether ``key`` defines the run (never changes on resume)."""
    return key in FIXED_KEYS or key.startswith(FIXED_PREFIXES)


def _allowed(key: str, allow: tuple[str, ...]) -> bool:
    return any(key == a or key.startswith(f"{a}.") for a in allow)


def config_changes(saved: Config, new: Config) -> dict[str, tuple[Any, Any]]:
    """Every dotted key whose value differs: ``{key: (saved value, new value)}``."""
    old, cur = _flat(to_dict(saved)), _flat(to_dict(new))
    return {k: (old.get(k), cur.get(k)) for k in sorted(set(old) | set(cur)) if old.get(k) != cur.get(k)}


def check_config_changes(
    run_dir: str | Path, saved: Config, new: Config, allow: tuple[str, ...] = ()
) -> dict[str, tuple[Any, Any]]:
    """The changes a resume of ``run_dir`` makes to its saved config (``FREE_KEYS`` and those named in
    ``allow``); raises :class:`ResumeRefused` for any other change, listing each. ``allow`` naming a key
    that defines the run is refused too (it cannot be allowed)."""
    bad_allow = [a for a in allow if is_fixed(a) or f"{a}." in FIXED_PREFIXES]
    if bad_allow:
        raise ResumeRefused(
            f"--allow-change {', '.join(bad_allow)}: these keys define the run and cannot change on resume "
            f"({', '.join(p.rstrip('.') for p in FIXED_PREFIXES)} and {', '.join(sorted(FIXED_KEYS))})"
        )
    changes = config_changes(saved, new)
    fixed = {k: v for k, v in changes.items() if is_fixed(k)}
    unasked = {k: v for k, v in changes.items() if not is_fixed(k) and k not in FREE_KEYS and not _allowed(k, allow)}
    if fixed:
        newest = latest_checkpoint(run_dir) or Path(run_dir) / "checkpoints" / "step-N"
        listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in fixed.items())
        raise ResumeRefused(
            f"cannot resume {run_dir} with a different run: {listed}. These keys define the run (its prompts, "
            "groups and staleness budget); nothing was changed. To train on with them, start a new run from "
            f"the newest checkpoint's weights: asyncrl train --model {newest} --run-dir NEW_DIR ..."
        )
    if unasked:
        listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in unasked.items())
        flags = " ".join(f"--allow-change {k}" for k in unasked)
        raise ResumeRefused(
            f"resuming {run_dir} would change {listed}; nothing was changed. If that is meant, add {flags} "
            f"(what may change without it: {', '.join(sorted(FREE_KEYS - {'run.run_dir'}))})"
        )
    return {k: v for k, v in changes.items() if k != "run.run_dir"}


def check_offsets(run_dir: str | Path, offsets: dict[str, int], checkpoint: str | Path) -> None:
    """Refuse (:class:`ResumeRefused`) when a jsonl file of ``run_dir`` is shorter than the byte offset
    ``checkpoint`` recorded for it, or does not end a line there."""
    problems = []
    for name, offset in sorted(offsets.items()):
        offset = int(offset)
        path = Path(run_dir) / name
        size = path.stat().st_size if path.is_file() else 0
        if size < offset:
            problems.append(f"{name} holds {size} bytes, fewer than the {offset} the checkpoint counts on")
        elif offset > 0:
            with open(path, "rb") as fh:
                fh.seek(offset - 1)
                if fh.read(1) != b"\n":
                    problems.append(f"{name} does not end a line at byte {offset}, where the checkpoint cut it")
    if problems:
        raise ResumeRefused(
            f"cannot resume {run_dir} from {Path(checkpoint).name}: {'; '.join(problems)}. The file was cut or "
            "changed after the checkpoint, and resuming would lose the lines it held; nothing was changed. "
            "Restore the file from a backup and resume again, or start a new run from the checkpoint's weights: "
            f"asyncrl train --model {checkpoint} --run-dir NEW_DIR"
        )


def _nonempty(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


def check_restartable(run_dir: str | Path) -> None:
    """A run with no checkpoint may start over in place only if it never finished a training step and
    never ended (``metrics.jsonl`` empty, no ``summary.json``, no final ``checkpoint/``); else
    :class:`ResumeRefused`."""
    run = Path(run_dir)
    held = [
        name
        for name, found in (
            ("metrics.jsonl (trained steps)", _nonempty(run / "metrics.jsonl")),
            ("summary.json (the run ended)", (run / "summary.json").exists()),
            ("checkpoint/ (its final model)", (run / "checkpoint").exists()),
        )
        if found
    ]
    if held:
        raise ResumeRefused(
            f"cannot resume {run}: it has no checkpoint to resume from (checkpoints/ is missing or empty), "
            f"but it holds {', '.join(held)}, which starting over would lose; nothing was changed. Restore "
            f"checkpoints/ from a backup, or start a new run elsewhere (--run-dir NEW_DIR; a finished run's "
            f"model is {run / 'checkpoint'})."
        )


def check_not_finished(run_dir: str | Path, total_steps: int) -> None:
    """Refuse (:class:`ResumeRefused`) to resume a run that ended by reaching ``total_steps`` steps
    (its ``summary.json`` says so): there is nothing to train, and its summary and final model stay."""
    path = Path(run_dir) / "summary.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    steps = summary.get("steps") if isinstance(summary, dict) else None
    if isinstance(steps, int) and summary.get("stop_reason") is None and steps >= total_steps:
        raise ResumeRefused(
            f"{run_dir} already finished: it trained {steps} steps and controller.total_steps is {total_steps}; "
            f"nothing was changed. To train on, raise it: asyncrl train --resume {run_dir} --set "
            f"controller.total_steps={steps + max(1, steps // 2)} (for example)"
        )
