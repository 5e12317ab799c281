"""What the whole-run benches share (``bench async``, ``interrupt``, ``adaptive``, ``headline``,
``plan-check``, ``agent-learning``): a fresh output directory per invocation (``fresh_out``), one real
training run measured into a row (``run_and_measure``; an interrupted invocation's finished runs measured again
from their directories, ``reusable_run`` / ``measure_finished_run``), the printed table and the JSON file, and
finding a row's run directory again when a finished JSON is reanalysed (``resolve_run_dir``).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from asyncrl.controller.throughput import FINISHED, generated_tokens, measure_throughput
from asyncrl.controller.time_budget import time_budget
from asyncrl.results import write_text_result

__all__ = [
    "fresh_out",
    "mean_or_zero",
    "measure_finished_run",
    "measure_run",
    "print_table",
    "resolve_run_dir",
    "reusable_run",
    "run_and_measure",
    "train_or_stop",
    "write_json",
]


def fresh_out(out_dir: str) -> Path:
    """A new ``out_dir/<timestamp>`` for this invocation's run directories (made now)."""
    from asyncrl.controller.run_claim import fresh_subdir

    out = fresh_subdir(out_dir)
    print(f"bench: run directories under {out}", flush=True)
    return out


def resolve_run_dir(stored: str, json_path: str | Path) -> Path:
    """The run directory a bench JSON's row names (``run_dir``, as stored), on this machine now. An
    absolute path is taken as it is. A relative one is relative to where the bench ran (usually the
    repository root): it is looked for under the current directory first, then under the JSON's folder
    and each folder above it (a JSON in ``docs/results/`` finds ``runs/...`` at the repository root).
    Raises ``FileNotFoundError`` naming the directory and where it was looked for."""
    path = Path(stored)
    if path.is_absolute():
        if path.is_dir():
            return path
        raise FileNotFoundError(f"run directory {stored} (a row of {json_path}) does not exist")
    json_dir = Path(json_path).resolve().parent
    for base in (Path.cwd(), json_dir, *json_dir.parents):
        if (base / path).is_dir():
            return base / path
    raise FileNotFoundError(
        f"run directory {stored} (a row of {json_path}) not found under the current directory {Path.cwd()} "
        f"nor under {json_dir} or any folder above it; run from the folder the bench ran in"
    )


def train_or_stop(cfg: Any) -> tuple[Path, dict[str, Any]]:
    """``train(cfg)``, the bench's only way into a run: a run stopped by SIGINT/SIGTERM (its graceful stop, with a
    checkpoint) stops the whole bench (``KeyboardInterrupt``) instead of the bench going on to its next run."""
    from asyncrl.launch.local import train

    run_dir, summary = train(cfg)
    if summary.get("stop_reason"):
        raise KeyboardInterrupt(f"run {run_dir} stopped by {summary['stop_reason']}")
    return run_dir, summary


def run_and_measure(overrides: list[str], run_dir: Path, warmup_s: float = 0.0) -> dict[str, Any]:
    """One training run; the row of its summary, throughput (``measure_throughput`` with a warm-up
    of ``warmup_s`` seconds of RL time), per-step averages and policy snapshots (if any)."""
    from asyncrl.config import load_config

    cfg = load_config(None, [*overrides, f"run.run_dir={run_dir}", "run.progress=false"])
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    _, summary = train_or_stop(cfg)  # refuses a run_dir that already holds a run
    load1 = os.getloadavg()[0]
    return measure_run(run_dir, cfg, summary, warmup_s, wall_s=time.perf_counter() - t0, load=[load0, load1])


def reusable_run(overrides: list[str], run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a finished run of exactly this arm: a summary, and a saved config
    equal to the arm's in every key but the run directory itself (what a bench reads instead of
    training again when given an interrupted invocation's directory)."""
    from dataclasses import asdict

    from asyncrl.config import load_config

    if not (run_dir / "summary.json").is_file() or not (run_dir / "config.yaml").is_file():
        return False
    wanted = asdict(load_config(None, [*overrides, "run.progress=false"]))
    saved = asdict(load_config(run_dir / "config.yaml"))
    for config in (wanted, saved):
        config["run"].pop("run_dir")  # a run directory moved since is still the same run
    return saved == wanted


def measure_or_reuse(
    overrides: list[str], run_dir: Path, warmup_s: float, reuse: Path | None, bench: str
) -> dict[str, Any]:
    """``run_and_measure``'s row; with ``reuse`` (an interrupted invocation's directory), a finished run of the same
    arm there (same name, same config: ``reusable_run``) is measured instead of trained again, its row saying
    ``reused`` (its ``run_dir`` the earlier one)."""
    prior = reuse / run_dir.name if reuse is not None else None
    if prior is not None and reusable_run(overrides, prior):
        print(f"bench {bench}: reusing the finished run {prior}", flush=True)
        return {**measure_finished_run(prior, warmup_s), "reused": True}
    return run_and_measure(overrides, run_dir, warmup_s)


def measure_finished_run(run_dir: Path, warmup_s: float = 0.0) -> dict[str, Any]:
    """``run_and_measure``'s row of a run that has already finished (``reusable_run``), read from its directory:
    its wall time the summary's, its load unknown (None)."""
    from asyncrl.config import load_config

    summary = json.loads((run_dir / "summary.json").read_text())
    cfg = load_config(run_dir / "config.yaml")
    return measure_run(run_dir, cfg, summary, warmup_s, wall_s=summary.get("wall_s"), load=None)


def measure_run(
    run_dir: Path, cfg: Any, summary: dict[str, Any], warmup_s: float, *, wall_s: float | None, load: list[float] | None
) -> dict[str, Any]:
    """The row of the finished run in ``run_dir`` (config ``cfg``, its ``summary``): ``run_and_measure``'s."""
    from asyncrl.controller.run_claim import check_one_run, read_jsonl

    check_one_run(run_dir)  # every number below comes from this run's lines alone
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    ledger = read_jsonl(run_dir / "trajectories.jsonl")
    timeline = read_jsonl(run_dir / "timeline.jsonl")
    try:
        speed = measure_throughput(metrics, ledger, timeline, warmup_s=warmup_s)
        throughput: dict[str, Any] = speed.as_row()
        throughput["time_budget"] = time_budget(metrics, timeline)
    except ValueError as exc:  # a run shorter than the warm-up: keep the row, say why it has no window
        print(f"bench: {run_dir}: no steady-state throughput ({exc})", flush=True)
        throughput = {"steady_state_tokens_per_s": None, "steady_state_error": str(exc)}
    finished = [r for r in ledger if r["status"] in FINISHED]
    generated = sum(generated_tokens(r) for r in finished)
    trained = sum(m["trained_tokens"] for m in metrics)
    busy = sum(m["train_step_s"] + m["weight_sync_s"] for m in metrics)
    lens = sorted(r["response_len"] for r in finished) or [0]
    return {
        **throughput,
        "trained_tokens_per_s": summary["trained_tokens_per_s"],
        "accuracy_before": summary["accuracy_before"],
        "accuracy_after": summary["accuracy_after"],
        "rl_wall_s": summary["rl_wall_s"],
        "wall_s": wall_s,
        "steps": summary["steps"],
        "trained_tokens": summary["trained_tokens"],
        "trainer_alone_tokens_per_s": trained / busy if busy else 0.0,
        "trained_per_generated_token": summary["trained_tokens"] / max(1, generated),
        "response_len_p50": lens[len(lens) // 2],
        "response_len_p90": lens[int(0.9 * (len(lens) - 1))],
        "response_len_max": lens[-1],
        "staleness_mean": mean_or_zero([m["staleness_mean"] for m in metrics]),
        "max_staleness_seen": summary["max_staleness_seen"],
        "stale_groups": summary["stale_groups"],
        "filtered_groups": summary["filtered_groups"],
        "unused_groups": sum(1 for r in ledger if r["status"] == "unused") // cfg.rollout.group_size,
        "buffered_max": max((m["buffer_groups"] for m in metrics), default=0),
        "engine_busy_frac": mean_or_zero([m["engine_busy_frac"] for m in metrics]),
        "trainer_busy_frac": mean_or_zero([m["trainer_busy_frac"] for m in metrics]),
        "load_avg_1m_start_end": load,
        "train_step_s": mean_or_zero([m["train_step_s"] for m in metrics]),
        "interruptions_per_sample": mean_or_zero([m["interruptions_per_sample"] for m in metrics]),
        "weight_sync_s": mean_or_zero([m["weight_sync_s"] for m in metrics]),
        "snapshots": read_jsonl(run_dir / "snapshots.jsonl"),
        "run_dir": str(run_dir),
    }


def mean_or_zero(values: list[float]) -> float:
    """The mean of ``values``; 0.0 for none."""
    return statistics.fmean(values) if values else 0.0


def print_table(title: str, rows: list[dict[str, Any]], keys: list[str], width: int = 22, digits: int = 3) -> None:
    """``rows`` under ``title``, one column per key, ``width`` characters each (floats to ``digits`` places)."""
    print(f"\n{title}")
    print("  ".join(f"{k:>{width}}" for k in keys))
    for row in rows:
        cells = []
        for k in keys:
            v = row.get(k)
            cells.append(f"{v:>{width}.{digits}f}" if isinstance(v, float) else f"{v!s:>{width}}")
        print("  ".join(cells))


def write_json(json_path: str | None, payload: dict[str, Any]) -> Path | None:
    """``payload`` to ``json_path``, never replacing a file (``output.write_result``: one that appeared while
    the bench ran is kept and this result written beside it); the path written, None without a path."""
    if not json_path:
        return None
    written = write_text_result(json_path, json.dumps(payload, indent=2))
    print(f"\nwrote {written}")
    return written
