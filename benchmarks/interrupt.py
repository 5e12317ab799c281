"""``python -m benchmarks interrupt``: in-flight weight updates against draining the engine before each one.

Owns the benchmark and its command (``add_arguments``, ``run``). At one max_staleness on one named
workload (``data.workloads``; default ``long``, where responses are long enough for an update to meet
them running), three arms of whole training runs side by side: in-flight updates in ``abort`` mode
(the running samples re-prefilled under the new weights), in ``keep`` mode (their KV cache kept), and
``drain`` (stop admitting, wait for the running episodes to finish, then update: no interruption).
Rows are ``async_bench``'s run measures; ratios are each arm's trained tokens/s over ``drain``'s.
"""

from __future__ import annotations

import argparse
from typing import Any

from asyncrl.config import ConfigError
from asyncrl.data.workloads import WORKLOAD_ALIASES, WORKLOADS
from benchmarks import options
from benchmarks.async_bench import workload_overrides
from benchmarks.options import add_json, add_out, add_overrides, add_steps
from benchmarks.runs import fresh_out, print_table, run_and_measure, write_json

__all__ = ["add_arguments", "run", "run_interrupt_bench"]


def run_interrupt_bench(
    json_path: str | None,
    *,
    overrides: list[str] | None = None,
    max_staleness: int = 4,
    workload: str = "long",
    steps: int | None = None,
    out_dir: str = "runs/bench-interrupt",
) -> dict[str, Any]:
    """In-flight updates (abort, keep) against draining the engine before each update (run
    directories under a new ``out_dir/<timestamp>/``)."""
    base = list(overrides or [])
    out = fresh_out(out_dir)
    if steps is not None:
        base.append(f"controller.total_steps={steps}")
    workload = WORKLOAD_ALIASES.get(workload, workload)
    wl = [*workload_overrides(base, workload), f"controller.max_staleness={max_staleness}"]
    modes = {
        "abort": ["controller.weight_sync=inflight", "rollout.interrupt_mode=abort"],
        "keep": ["controller.weight_sync=inflight", "rollout.interrupt_mode=keep"],
        "drain": ["controller.weight_sync=drain"],
    }
    rows = []
    for mode, extra in modes.items():
        print(f"\n=== bench interrupt: {mode} (max_staleness={max_staleness}, workload {workload}) ===", flush=True)
        rows.append({"update_mode": mode, "max_staleness": max_staleness, **run_and_measure([*wl, *extra], out / mode)})
    drain = rows[-1]
    for row in rows:
        row["throughput_ratio_vs_drain"] = row["trained_tokens_per_s"] / max(drain["trained_tokens_per_s"], 1e-9)
    keys = [
        "update_mode",
        "trained_tokens_per_s",
        "throughput_ratio_vs_drain",
        "steady_state_tokens_per_s",
        "interruptions_per_sample",
        "weight_sync_s",
        "staleness_mean",
        "accuracy_after",
    ]
    print_table("bench interrupt: in-flight weight updates vs draining", rows, keys)
    ratios = {f"{r['update_mode']}_vs_drain": r["throughput_ratio_vs_drain"] for r in rows}
    payload = {"bench": "interrupt", "overrides": wl, "rows": rows, "ratios": ratios, "out_dir": str(out)}
    write_json(json_path, payload)
    return payload


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json``, the runs (``--set``, ``--model``, ``--steps``, ``--out``), ``--max-staleness``, ``--workload``."""
    add_json(parser)
    add_overrides(parser, "model directory of every run (default: the workload's own warm start)")
    add_steps(parser)
    parser.add_argument(
        "--max-staleness",
        type=int,
        default=4,
        help="controller.max_staleness of every arm (default 4)",
    )
    parser.add_argument("--workload", default="long", help=f"one workload (default long; {', '.join(WORKLOADS)})")
    add_out(parser, "runs/bench-interrupt")


def run(args: argparse.Namespace) -> None:
    """The three arms."""
    if WORKLOAD_ALIASES.get(args.workload, args.workload) not in WORKLOADS:
        raise ConfigError(f"unknown workload {args.workload!r} (available: {', '.join(WORKLOADS)})")
    run_interrupt_bench(
        args.json,
        overrides=options.overrides(args),
        steps=args.steps,
        out_dir=args.out,
        max_staleness=args.max_staleness,
        workload=args.workload,
    )
