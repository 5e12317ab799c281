"""A headline arm continued past its time budget: does η = 0 lose accuracy with more steps, or η > 0 keep it?

Issue 15's equal-budget headline (docs/controller.md §5.0.3) saw η = 4 lose held-out accuracy after about
20 versions on workload ``reason`` while η = 0, stopped by the same 420 s budget at 23-31 versions, did not.
This probe separates "more steps" from "asynchrony": it trains η = 0 with the headline file's own overrides
and synchronous setting but no budget (``--steps`` versions), saves snapshots every 15 s of RL time, and
scores the chosen versions at ``--samples-per-prompt`` as the headline scores its snapshots. Synchronous
training repeats a seed's samples while the engine's batches are formed alike (not always: batch shapes
depend on request timing, docs/controller.md §5.0.4), so check that the first versions repeat the headline's
own η = 0 run (its ledger, step by step, and the shared versions' accuracies) before reading the rest.

    python scripts/reason_continuation.py --headline docs/results/headline_reason_time_budget.json \\
        --seeds 6 --steps 40 --versions 23,27,31,34,37,40 --out runs/continuation \\
        --json docs/results/headline_reason_eta0_continuation.json

``--eta`` > 0 runs the asynchronous arm instead (the headline's ``ASYNC_SETTING``) and ``--set`` adds overrides,
e.g. the objective: ``--eta 4 --set algo.prox_mode=behav`` (naive PPO) on the headline's workload.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def base_overrides(headline: dict, steps: int) -> list[str]:
    """The headline's overrides without its budget and step cap, with ``steps`` as the cap."""
    dropped = ("controller.max_rl_time_s=", "controller.total_steps=")
    return [o for o in headline["overrides"] if not o.startswith(dropped)] + [f"controller.total_steps={steps}"]


def main() -> None:
    from benchmarks.headline import ASYNC_SETTING, SYNC_CANDIDATES, evaluate_snapshots, with_samples_per_prompt
    from benchmarks.runs import run_and_measure

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--headline", required=True, help="a bench headline JSON (its overrides and sync setting)")
    parser.add_argument("--seeds", default="6")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--versions", default="23,27,31,34,37,40", help="snapshot versions to score")
    parser.add_argument("--samples-per-prompt", type=int, default=8)
    parser.add_argument("--out", default="runs/continuation")
    parser.add_argument("--eta", type=int, default=0, help="controller.max_staleness of the arm")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more overrides")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    headline = json.loads(Path(args.headline).read_text())
    base = base_overrides(headline, args.steps) + list(args.set)
    scoring = with_samples_per_prompt(base, args.samples_per_prompt)
    versions = {int(v) for v in args.versions.split(",")}
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        setting = SYNC_CANDIDATES[headline["sync_setting"]] if args.eta == 0 else ASYNC_SETTING
        over = [
            *base,
            *setting,
            f"run.seed={seed}",
            f"controller.max_staleness={args.eta}",
            "controller.snapshot_every_s=15",
        ]
        row = run_and_measure(over, Path(args.out) / f"s{seed}-eta{args.eta}", 60.0)
        snaps = [s for s in row["snapshots"] if s["version"] in versions]
        accuracies = evaluate_snapshots(scoring, snaps)
        curve = [{"version": s["version"], "t": s["t"], "accuracy": a} for s, a in zip(snaps, accuracies, strict=True)]
        rows.append({"seed": seed, "steps": row["steps"], "stale_groups": row["stale_groups"], "curve": curve})
        print(seed, [(c["version"], round(c["accuracy"], 3)) for c in rows[-1]["curve"]], flush=True)
    payload = {
        "probe": "reason_continuation",
        "headline": args.headline,
        "eta": args.eta,
        "overrides": base,
        "sync_setting": headline["sync_setting"],
        "eval_samples_per_prompt": args.samples_per_prompt,
        "rows": rows,
    }
    Path(args.json).write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks/ beside src/
    main()
