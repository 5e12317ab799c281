"""Before/after timing of LocalEngine at two git revisions (issue 17: the engine-step refactor).

Runs ``benchmarks.engine``'s LocalEngine workload (the same prompts, the same forced
long-tailed response lengths, temperature 1, one torch thread) with the code of each revision,
alternating the two revisions ``--repeats`` times in fresh processes so that load drift on a shared
machine hits both sides alike. Both sides load the same model directory (built once, by the
current checkout's ``build_tiny_policy``). Each revision is checked out into a detached git
worktree under a temporary directory that is removed at the end.

    python scripts/engine_before_after.py --before eb25a89^ --after HEAD --repeats 5 \
        --json docs/results/engine_step_before_after.json

The JSON holds every repetition's row, the per-side mean with a 95% interval, and the paired
ratio after/before. Decode steps and useful tokens must agree between the sides (the workload is
the same and the scheduler's decisions do not depend on timing): the script fails if they do not.
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

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "src"), str(REPO)]  # the product and benchmarks/ beside it

ONE_RUN = """
import json, random, sys
import torch
torch.set_num_threads(1)
try:  # benchmarks/ beside src/, or (a revision before the move) the package's bench/
    from benchmarks.engine import _prompts, _run_local, long_tailed_lengths
except ImportError:
    from asyncrl.bench.engine import _prompts, _run_local, long_tailed_lengths
from asyncrl.models import load_policy
model_dir, n, slots, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
model, tokenizer = load_policy(model_dir)
rng = random.Random(seed)
prompts = _prompts(tokenizer, n, rng)
lengths = long_tailed_lengths(n, rng)
max_seq_len = max(320, max(len(p) for p in prompts) + max(lengths))
print("ROW " + json.dumps(_run_local(model, tokenizer, prompts, lengths, slots, max_seq_len)))
"""


def git(*args: str) -> str:
    """The output of ``git -C <repo> ARGS`` (fails loudly)."""
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout.strip()


def _one_run(worktree: Path, model_dir: Path, requests: int, slots: int, seed: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(worktree / "src"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", ONE_RUN, str(model_dir), str(requests), str(slots), str(seed)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=worktree,
    )
    line = next(x for x in out.stdout.splitlines() if x.startswith("ROW "))
    return json.loads(line[4:])


def main(argv: list[str] | None = None) -> int:
    from asyncrl.models import build_tiny_policy
    from benchmarks.stats import mean_ci95

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="git revision of the 'before' side")
    ap.add_argument("--after", default="HEAD", help="git revision of the 'after' side")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)
    if args.repeats < 2:
        ap.error("--repeats must be >= 2 (an interval needs two repetitions)")
    revs = {"before": git("rev-parse", args.before), "after": git("rev-parse", args.after)}
    rows: dict[str, list[dict]] = {"before": [], "after": []}
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="engine-before-after-") as tmp:
        model_dir = build_tiny_policy(Path(tmp) / "tiny")
        trees = {side: Path(tmp) / side for side in revs}
        for side, rev in revs.items():
            git("worktree", "add", "--detach", str(trees[side]), rev)
        try:
            for rep in range(args.repeats):
                order = ("before", "after") if rep % 2 == 0 else ("after", "before")
                for side in order:
                    row = _one_run(trees[side], model_dir, args.requests, args.slots, args.seed)
                    row["repeat"] = rep
                    rows[side].append(row)
                    print(
                        f"repeat {rep} {side:6s} {row['useful_tokens_per_s']:8.1f} useful tok/s "
                        f"({row['wall_s']:.2f} s, {row['decode_steps']} steps)",
                        flush=True,
                    )
        finally:
            for tree in trees.values():
                git("worktree", "remove", "--force", str(tree))
    for key in ("decode_steps", "useful_tokens"):
        seen = {r[key] for side in rows.values() for r in side}
        if len(seen) != 1:
            raise SystemExit(f"the two sides did not run the same workload: {key} took values {sorted(seen)}")
    ratios = [
        a["useful_tokens_per_s"] / b["useful_tokens_per_s"] for a, b in zip(rows["after"], rows["before"], strict=True)
    ]
    result = {
        "script": "scripts/engine_before_after.py",
        "argv": sys.argv[1:] if argv is None else argv,
        "revisions": revs,
        "requests": args.requests,
        "slots": args.slots,
        "seed": args.seed,
        "load_avg_start": load_start,
        "load_avg_end": os.getloadavg(),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "rows": rows,
        "useful_tokens_per_s": {side: mean_ci95([r["useful_tokens_per_s"] for r in rs]) for side, rs in rows.items()},
        "ratio_after_over_before": {"per_repeat": ratios, **mean_ci95(ratios)},
    }
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    r = result["ratio_after_over_before"]
    print(f"after / before: {r['mean']:.3f} (95% interval {r['low']:.3f}-{r['high']:.3f}, n={r['n']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
