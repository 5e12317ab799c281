"""Before/after of the whole training loop at two git revisions (issue 17: the seams, the stage
builder and the loop refactor must leave the benches' numbers unchanged).

Runs ``python -m benchmarks async`` (the same workload, arms, steps, seeds and overrides) with the code of
each revision, one seed at a time, the two revisions alternated seed by seed (before first on even
seeds, after first on odd ones) so that load drift on a shared machine hits both sides alike. Each
revision runs from a detached git worktree under a temporary directory (removed at the end) whose
``.cache`` links to this checkout's, so both sides start from the same warm-start policy when their
cache keys agree.

    python scripts/loop_before_after.py --before 3f06c79^ --after HEAD --seeds 0,1,2 \
        --json docs/results/loop_before_after_task.json

Per arm (``max_staleness``) and seed: whole-run and steady-state trained tokens/s, held-out accuracy
after RL, and whether the accuracy is bit-identical between the sides. Paired ratios after/before
(95% t-interval over seeds) and the η>0 : η=0 speed-up of each side, as ``bench async`` reports it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine_before_after import REPO, git

ROW_KEYS = (
    "max_staleness",
    "seed",
    "trained_tokens_per_s",
    "steady_state_tokens_per_s",
    "accuracy_before",
    "accuracy_after",
    "rl_wall_s",
    "steps",
    "trained_tokens",
    "staleness_mean",
    "load_avg_1m_start_end",
)
THROUGHPUT_KEYS = ("trained_tokens_per_s", "steady_state_tokens_per_s")


def _bench_once(worktree: Path, seed: int, args: argparse.Namespace, scratch: Path) -> list[dict]:
    """One ``python -m benchmarks async`` invocation (one seed, every arm) with ``worktree``'s code."""
    out_json = scratch / f"{worktree.name}-s{seed}.json"
    # benchmarks/ beside src/, or (a revision before the move) the package's ``python -m benchmarks``
    moved = (worktree / "benchmarks" / "__main__.py").exists()
    entry = ["-m", "benchmarks"] if moved else ["-m", "asyncrl.cli", "bench"]
    cmd = [
        sys.executable,
        *entry,
        "async",
        "--workload",
        args.workload,
        "--etas",
        args.etas,
        "--seeds",
        str(seed),
        "--steps",
        str(args.steps),
        "--warmup-s",
        str(args.warmup_s),
        "--out",
        str(scratch / f"runs-{worktree.name}"),
        "--json",
        str(out_json),
    ]
    for override in args.set or []:
        cmd += ["--set", override]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(worktree / "src"), str(worktree)])}
    subprocess.run(cmd, check=True, env=env, cwd=worktree, stdout=subprocess.DEVNULL)
    rows = json.loads(out_json.read_text())["rows"]
    return [{key: row.get(key) for key in ROW_KEYS} for row in rows]


def _paired(rows: dict[str, list[dict]], key: str, eta: int) -> list[float]:
    """after/before of ``key`` for arm ``eta``, seed by seed."""
    before = {r["seed"]: r[key] for r in rows["before"] if r["max_staleness"] == eta}
    after = {r["seed"]: r[key] for r in rows["after"] if r["max_staleness"] == eta}
    return [after[s] / before[s] for s in sorted(before) if before[s] and after.get(s)]


def _speedups(side_rows: list[dict], key: str, eta: int) -> list[float]:
    """η=eta : η=0 of ``key`` within one side, seed by seed."""
    sync = {r["seed"]: r[key] for r in side_rows if r["max_staleness"] == 0}
    arm = {r["seed"]: r[key] for r in side_rows if r["max_staleness"] == eta}
    return [arm[s] / sync[s] for s in sorted(sync) if sync[s] and arm.get(s)]


def summarise(rows: dict[str, list[dict]]) -> dict:
    """Paired after/before ratios per arm, accuracy differences and each side's speed-ups."""
    from benchmarks.stats import mean_ci95

    etas = sorted({r["max_staleness"] for r in rows["before"]})
    out: dict = {}
    for eta in etas:
        before = {r["seed"]: r for r in rows["before"] if r["max_staleness"] == eta}
        after = {r["seed"]: r for r in rows["after"] if r["max_staleness"] == eta}
        acc_diff = [100 * (after[s]["accuracy_after"] - before[s]["accuracy_after"]) for s in sorted(before)]
        identical = [s for s in sorted(before) if after[s]["accuracy_after"] == before[s]["accuracy_after"]]
        out[f"eta{eta}"] = {
            "whole_run_after_over_before": mean_ci95(_paired(rows, THROUGHPUT_KEYS[0], eta)),
            "steady_state_after_over_before": mean_ci95(_paired(rows, THROUGHPUT_KEYS[1], eta)),
            "accuracy_after_minus_before_points": {"per_seed": acc_diff, **mean_ci95(acc_diff)},
            "accuracy_identical_seeds": identical,
        }
        if eta:
            out[f"eta{eta}"]["speedup_over_eta0"] = {
                side: {key: mean_ci95(_speedups(side_rows, key, eta)) for key in THROUGHPUT_KEYS}
                for side, side_rows in rows.items()
            }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="git revision of the 'before' side")
    ap.add_argument("--after", default="HEAD", help="git revision of the 'after' side")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--workload", default="task")
    ap.add_argument("--etas", default="0,8")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup-s", type=float, default=10.0)
    ap.add_argument("--set", action="append", help="a config override passed to both sides' bench (repeatable)")
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    if len(seeds) < 2:
        ap.error("--seeds needs two or more seeds (an interval needs two)")
    revs = {"before": git("rev-parse", args.before), "after": git("rev-parse", args.after)}
    rows: dict[str, list[dict]] = {"before": [], "after": []}
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="loop-before-after-") as tmp:
        scratch = Path(tmp)
        trees = {side: scratch / side for side in revs}
        for side, rev in revs.items():
            git("worktree", "add", "--detach", str(trees[side]), rev)
            (REPO / ".cache").mkdir(exist_ok=True)
            (trees[side] / ".cache").symlink_to(REPO / ".cache")
        try:
            for i, seed in enumerate(seeds):
                for side in ("before", "after") if i % 2 == 0 else ("after", "before"):
                    for row in _bench_once(trees[side], seed, args, scratch):
                        rows[side].append(row)
                        print(
                            f"seed {seed} {side:6s} eta {row['max_staleness']}: {row['trained_tokens_per_s']:7.1f} "
                            f"trained tok/s, accuracy {row['accuracy_after']:.4f}",
                            flush=True,
                        )
        finally:
            for tree in trees.values():
                git("worktree", "remove", "--force", str(tree))
    result = {
        "script": "scripts/loop_before_after.py",
        "argv": sys.argv[1:] if argv is None else argv,
        "revisions": revs,
        "load_avg_start": load_start,
        "load_avg_end": os.getloadavg(),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "rows": rows,
        "summary": summarise(rows),
    }
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.path[:0] = [str(REPO / "src"), str(REPO)]  # the product and benchmarks/ beside it
    raise SystemExit(main())
