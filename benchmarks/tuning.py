"""Step-size tuning shared by the benches that run each arm at its own best step size (``objectives``, ``headline``).

An arm (an objective, a bound η) is run over a grid of step sizes on the tuning seeds; ``tuning_table`` gives each
(arm, step size) its mean final held-out accuracy with a 95% t-interval, and ``best_lrs`` picks each arm's step size
of highest mean (ties: the smaller step). Tuning takes longer than one sitting, so the rows so far are kept in a
progress file after every run (``write_progress``: replaced in one rename, never half written) that a later
invocation continues from.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

from asyncrl.config import ConfigError
from benchmarks.stats import mean_ci95

__all__ = ["best_lrs", "progress_path", "refuse_unnamed_progress", "tuning_table", "write_progress"]


def tuning_table(
    rows: Sequence[dict[str, Any]],
    arm_key: str,
    arms: Sequence[Hashable],
    lrs: Sequence[float],
    seeds: Sequence[int],
    keep: Callable[[dict[str, Any]], bool] = lambda _row: True,
) -> list[dict[str, Any]]:
    """Per (arm, step size): the final accuracy (``accuracy_after``) over the rows of the tuning ``seeds`` whose
    ``row[arm_key]`` is the arm and that ``keep`` accepts (mean, 95% interval, ``n``); unfinished rows (no final
    accuracy) do not count."""
    out = []
    for arm in arms:
        for lr in lrs:
            acc = [
                r["accuracy_after"]
                for r in rows
                if r[arm_key] == arm and r["lr"] == lr and r["seed"] in seeds and keep(r)
            ]
            ci = mean_ci95([a for a in acc if a is not None])
            out.append(
                {
                    arm_key: arm,
                    "lr": lr,
                    "n": ci["n"],
                    "accuracy_after_mean": ci["mean"],
                    "accuracy_after_ci95": [ci["low"], ci["high"]] if ci["low"] is not None else None,
                }
            )
    return out


def best_lrs(table: Sequence[dict[str, Any]], arm_key: str) -> dict[Any, float]:
    """Each arm's step size of highest mean final accuracy in ``tuning_table`` (ties: the smaller); ValueError for
    an arm without a finished run."""
    best: dict[Any, float] = {}
    for arm in dict.fromkeys(t[arm_key] for t in table):
        cells = [t for t in table if t[arm_key] == arm and t["accuracy_after_mean"] is not None]
        if not cells:
            raise ValueError(f"no finished tuning run for {arm}")
        best[arm] = min(cells, key=lambda t: (-t["accuracy_after_mean"], t["lr"]))["lr"]
    return best


def write_progress(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` as JSON to ``path``, replacing it in one rename, so that a reader (or a kill) never sees
    half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        scratch.write_text(json.dumps(payload, indent=2) + "\n")
        os.replace(scratch, path)
    finally:
        scratch.unlink(missing_ok=True)


def progress_path(json_path: str | None, out: Path, bench: str) -> Path:
    """Where a bench keeps its rows so far: beside its result file (``<stem>.progress.json``), else in the
    invocation's run directory (``<bench>.progress.json``)."""
    if json_path:
        target = Path(json_path)
        return target.with_name(f"{target.stem}.progress.json")
    return out / f"{bench}.progress.json"


def refuse_unnamed_progress(progress: Path, rows_files: Sequence[str], option: str) -> None:
    """ConfigError (one line) when ``progress`` holds an earlier invocation's rows that this one does not continue
    from (``option`` names the files it does): its first run would replace them."""
    named = {Path(f).resolve() for f in rows_files}
    if progress.exists() and progress.resolve() not in named:
        raise ConfigError(
            f"{progress} holds the rows of an earlier invocation: continue with {option} {progress}, or move it "
            "away first"
        )
