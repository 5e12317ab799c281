"""Every benchmark ``docs/results.md`` cites, started once from its documented command line
(``python -m benchmarks NAME ...``) at the shortest setting its options allow, with what each returned.

``python scripts/bench_smoke.py`` runs ``SMOKES`` in order, each a subprocess from the repository root with
its result file (``--json``) and its run directories (``--out``) under ``--out`` (default
``runs/bench-smoke/<time>``), and writes ``docs/results/bench_smoke.json``: per benchmark the command, the
exit status, the wall seconds, the result file (its size and top-level keys) and, when it failed, the tail of
its stderr. ``--only a,b`` runs some of them; ``--update`` replaces their entries in an existing summary
(without it an existing summary is refused). ``--list`` prints the commands and runs nothing.

What it shows: that each command starts, runs its whole path (options, runs, analysis, result file) and
exits 0 at a tiny setting on this machine. What it does not: any figure of a benchmark (1-3 steps, one
seed, a few held-out prompts; the numbers in the result files mean nothing). ``sim-validate`` predicts the
run directories the ``async`` smoke wrote and ``headline --reevaluate`` re-scores the ``headline`` smoke's
result, so those two follow them. ``STARTED_BY_TESTS`` names the tests that also start a benchmark from its
command (``benchmarks.__main__.main``) on every ``make test``.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_MD = ROOT / "docs" / "results.md"
SUMMARY = ROOT / "docs" / "results" / "bench_smoke.json"

SMALL = (
    "--set task.eval_size=8 --set eval.samples_per_prompt=1 --set eval.report_greedy=false"
    " --set controller.batch_size=4"
)
"""Overrides that make a training run of the ``task`` workload short: 8 held-out prompts sampled once, 4 prompts
a step (the cached warm start is kept: none of these enters its key)."""


@dataclass(frozen=True)
class Smoke:
    """One benchmark invocation: a label, its command after ``python -m benchmarks`` (``{name}`` placeholders
    filled from the smokes before it) and whether it takes ``--out`` (where its run directories go)."""

    label: str
    command: str
    out: bool = True

    @property
    def name(self) -> str:
        return self.command.split()[0]


SMOKES: tuple[Smoke, ...] = (
    Smoke("ablation", f"ablation --objectives decoupled --lags 1 --seeds 0 --steps 2 {SMALL}"),
    Smoke("adaptive", f"adaptive --workload task --etas 2 --seeds 0 --steps 2 --warmup-s 0 {SMALL}"),
    Smoke("adaptive --profile", "adaptive --profile cpu-2core-tiny --workload task --etas 0,2 --seeds 0 --steps 10"),
    Smoke(
        "agent-learning",
        "agent-learning --seeds 0 --budget-s 60 --set sft.steps=4 --set sft.batch_size=8 --set controller.total_steps=2"
        " --set controller.eval_every=0 --set task.eval_size=8 --set rollout.group_size=4",
    ),
    Smoke(
        "agent-throughput",
        "agent-throughput --seeds 0 --steps 2 --warmup-s 0 --sync-setting threads1-trainer-process"
        " --set task.eval_size=4 --set controller.batch_size=2 --set rollout.group_size=2",
    ),
    Smoke("async", f"async --workload task --etas 0,2 --seeds 0 --steps 3 --warmup-s 0 --calibrate 0 {SMALL}"),
    Smoke("decode", "decode --contexts 50 --running 1,2", out=False),
    Smoke("engine", "engine --requests 16", out=False),
    Smoke(
        "headline",
        "headline --workload task --etas 0,2 --seeds 0 --steps 3 --sync-setting threads1-trainer-process"
        f" --snapshot-every 2 --warmup-s 0 {SMALL}",
    ),
    Smoke(
        "headline --reevaluate", "headline --reevaluate {headline_json} --samples-per-prompt 1 --etas 0,2", out=False
    ),
    Smoke(
        "headline --lrs",
        "headline --workload task --etas 0,2 --seeds 0 --steps 2 --sync-setting threads1-trainer-process"
        f" --snapshot-every 2 --warmup-s 0 --lrs 1e-4,2e-4 --tune-seeds 1 {SMALL}",
    ),
    Smoke("lora-update", "lora-update --shapes tiny --repeats 1 --slots 2 --tokens 8", out=False),
    Smoke(
        "objectives",
        "objectives --short --seeds 0 --objectives decoupled,naive --lrs 1e-4 --etas '' --tune-once"
        " --set task.eval_size=8",
    ),
    Smoke("paper-curves", "paper-curves --steps 10", out=False),
    Smoke("paper-curves-fitted", "paper-curves-fitted --steps 10", out=False),
    Smoke(
        "plan-check",
        "plan-check --plan docs/results/plan_cpu_task_calibrated_v2.json --max-settings 1 --seeds 0 --steps 2"
        f" --warmup-s 0 {SMALL}",
    ),
    Smoke("prefix-reuse", "prefix-reuse --seeds 0", out=False),
    Smoke("profile", "profile", out=False),
    Smoke("sim-validate", "sim-validate --runs {async_runs} --seeds 0", out=False),
    Smoke(
        "tinker-loop",
        "tinker-loop --seeds 0 --steps 1 --batch-size 2 --group-size 2 --max-new-tokens 16 --eval-size 4"
        " --update-repeats 1",
    ),
    Smoke("train", "train --models tiny --samples 8 --steps 1", out=False),
)
"""Each cited benchmark at its shortest setting, in the order run (``sim-validate`` after ``async``, ``headline
--reevaluate`` after ``headline``)."""

NEEDS = {"sim-validate": "async", "headline --reevaluate": "headline"}
"""The smokes that read what another wrote (``--only`` runs that one too)."""

STARTED_BY_TESTS = {
    "adaptive --profile": (
        "tests/benchmarks/test_adaptive_bench.py::test_the_cli_runs_the_simulated_mode_under_each_profile"
    ),
    "paper-curves": "tests/benchmarks/test_paper_curves.py::test_the_command_writes_the_json_and_the_plot",
    "paper-curves-fitted": "tests/benchmarks/test_paper_curves.py::test_the_command_writes_the_json_and_the_plot",
    "profile": "tests/sim/test_command.py::test_bench_profile_writes_this_machines_profile",
    "sim-validate": "tests/benchmarks/test_sim_validate.py::test_the_command_prints_the_table_and_writes_json",
}
"""The smokes whose command a test also starts from ``benchmarks.__main__.main`` (the others' tests run their
helpers, or their bodies on fakes or below the command line)."""


def cited() -> list[str]:
    """The benchmark names ``docs/results.md`` cites as ``python -m benchmarks NAME``, in order of appearance."""
    names = re.findall(r"python -m benchmarks ([a-z][a-z-]*)", RESULTS_MD.read_text(encoding="utf-8"))
    return list(dict.fromkeys(names))


def argv_of(smoke: Smoke, json_path: str, out_dir: str, values: dict[str, str]) -> list[str]:
    """The command line of ``smoke`` (``python -m benchmarks`` onwards), placeholders filled."""
    args = [a.format(**values) for a in shlex.split(smoke.command)]
    return [*args, "--json", json_path, *(["--out", out_dir] if smoke.out else [])]


def _safe(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", label).strip("_")


def _rel(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.as_posix()


def run_one(smoke: Smoke, base: Path, values: dict[str, str], timeout_s: float) -> dict[str, Any]:
    """Start ``smoke`` once; its entry of the summary."""
    stem = _safe(smoke.label)
    json_path, out_dir = base / f"{stem}.json", base / f"{stem}-runs"
    argv = argv_of(smoke, _rel(json_path), _rel(out_dir), values)
    command = "python -m benchmarks " + shlex.join(argv)
    print(f"== {smoke.label}: {command}", flush=True)
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks", *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s
        )
        rc, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        rc = 124
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        stderr = (exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or "") + "\n(timed out)"
    wall = time.perf_counter() - t0
    (base / f"{stem}.log").write_text(f"$ {command}\n--- stdout\n{stdout}\n--- stderr\n{stderr}")
    entry: dict[str, Any] = {
        "benchmark": smoke.label,
        "command": command,
        "rc": rc,
        "wall_s": round(wall, 1),
        "result_file": _rel(json_path),
        "log": _rel(base / f"{stem}.log"),
        "also_started_by_test": STARTED_BY_TESTS.get(smoke.label),
    }
    if json_path.exists():
        entry["result_bytes"] = json_path.stat().st_size
        try:
            loaded = json.loads(json_path.read_text())
            entry["result_keys"] = sorted(loaded) if isinstance(loaded, dict) else type(loaded).__name__
        except json.JSONDecodeError as exc:
            entry["result_keys"] = f"not JSON: {exc}"
    else:
        entry["result_bytes"] = None
    if rc != 0:
        entry["stderr_tail"] = stderr.strip().splitlines()[-15:]
    print(f"   rc {rc}, {wall:.1f} s, result {'written' if json_path.exists() else 'absent'}", flush=True)
    return entry


def _filled(smoke: Smoke, base: Path, entries: dict[str, dict[str, Any]], values: dict[str, str]) -> None:
    """After ``smoke`` ran, the placeholders it provides for the smokes that follow it."""
    if smoke.label == "async":
        runs = sorted({p.parent for p in (base / "async-runs").rglob("summary.json")})
        values["async_runs"] = ",".join(_rel(p) for p in runs)
    if smoke.label == "headline":
        values["headline_json"] = entries["headline"]["result_file"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated labels to run (default: all)")
    parser.add_argument(
        "--out", type=Path, help="where result files, logs and runs go (default runs/bench-smoke/<time>)"
    )
    parser.add_argument("--json", type=Path, default=SUMMARY, help=f"the summary (default {_rel(SUMMARY)})")
    parser.add_argument("--update", action="store_true", help="replace the entries run in an existing summary")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per benchmark (default 1800)")
    parser.add_argument("--list", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    labels = [s.label for s in SMOKES]
    chosen = args.only.split(",") if args.only else labels
    chosen += [NEEDS[c] for c in chosen if c in NEEDS and NEEDS[c] not in chosen]
    unknown = sorted(set(chosen) - set(labels))
    missing = sorted(set(cited()) - {s.name for s in SMOKES})
    if unknown or missing:
        print(f"bench_smoke: unknown {unknown}; cited in docs/results.md without a smoke: {missing}", file=sys.stderr)
        return 2
    if args.list:
        for s in SMOKES:
            print(
                "python -m benchmarks "
                + shlex.join(argv_of(s, "OUT.json", "OUT-runs", {"async_runs": "RUNS", "headline_json": "H.json"}))
            )
        return 0
    old: dict[str, Any] = {}
    if args.json.exists():
        if not args.update:
            print(f"bench_smoke: {args.json} exists (--update replaces the entries run)", file=sys.stderr)
            return 2
        old = json.loads(args.json.read_text())
    base = args.out or ROOT / "runs" / "bench-smoke" / time.strftime("%Y%m%d-%H%M%S")
    base.mkdir(parents=True, exist_ok=False)
    tree = {
        "commit": _git("rev-parse", "--short", "HEAD"),  # the code run: HEAD and the files edited beside it
        "uncommitted": _git("status", "--porcelain", "--", "src", "benchmarks").splitlines(),
    }
    values: dict[str, str] = {}
    entries: dict[str, dict[str, Any]] = {}
    for smoke in SMOKES:
        if smoke.label not in chosen:
            continue
        entries[smoke.label] = run_one(smoke, base, values, args.timeout_s)
        _filled(smoke, base, entries, values)
    kept = {e["benchmark"]: e for e in old.get("benchmarks", [])}
    kept.update({k: {**v, "tree": tree} for k, v in entries.items()})
    ordered = [kept[label] for label in labels if label in kept]
    summary = {
        "what": "each benchmark docs/results.md cites, started once from its documented command at a tiny setting "
        "(scripts/bench_smoke.py); rc, wall seconds and the result file, no figure of any benchmark",
        "cited": cited(),
        "machine": {"cores": _cores(), "python": sys.version.split()[0]},
        "ok": sum(e["rc"] == 0 and e["result_bytes"] is not None for e in ordered),
        "failed": [e["benchmark"] for e in ordered if e["rc"] != 0 or e["result_bytes"] is None],
        "benchmarks": ordered,
    }
    args.json.write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"{summary['ok']}/{len(ordered)} ran and wrote their result; failed: {summary['failed']}; "
        f"summary {_rel(args.json)}"
    )
    return 0 if not summary["failed"] else 1


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


if __name__ == "__main__":
    sys.exit(main())
