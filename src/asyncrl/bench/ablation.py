"""``asyncrl bench ablation``: off-policy objectives under controlled staleness (DESIGN §8).

Every row is a real training run (``launch.local.train``, in this process, one after the other,
each in its own run directory under a fresh ``--out``/<timestamp>/) with ``controller.fixed_lag = k``: step i trains on
samples generated entirely by version max(0, i - k), whatever the machine's speed, so the lag and
not the load decides staleness. Every group generated is trained (``algo.filter_equal_rewards=false``),
so all arms at the same seed train the same prompts in the same order, at every lag.

Grid: objectives (``OBJECTIVES``) x lags x learning rates x seeds, run seed-major (then lr, lag,
objective), so that load drift over the sweep hits every arm alike. Objectives:

- ``decoupled``: decoupled PPO, the proximal policy recomputed (``algo.prox_mode=recompute``);
- ``loglinear``: the proximal policy approximated from the stored versions (no extra forward);
- ``naive``: naive PPO, the behaviour policy as the clip centre (``algo.prox_mode=behav``);
- ``uncorrected``: the plain policy gradient ``-A·logp`` on the stale samples: no ratio, no clip,
  no cap (``algo.loss_type=pg``, ``prox_mode=behav``, ``behav_cap=null``);
- ``seq_tis`` / ``seq_mis``: decoupled PPO with sequence-level truncated / masked importance
  sampling (``behav_cap_level=sequence``, ``behav_cap_mode=clamp|mask``, cap 2);
- ``m2po``: decoupled PPO with M2PO's second-moment mask (``algo.m2_threshold=0.04``) in place of
  the behaviour cap;
- ``version_gap``: decoupled PPO dropping tokens more than 2 versions old
  (``algo.max_version_gap=2``). Under a fixed lag every token has gap exactly k, so this arm trains
  like ``decoupled`` for k <= 2 and on nothing at all for k > 2: a check of the mechanism, not a
  competitor.

Rows: ``objective``, ``lag``, ``lr``, ``seed``; held-out ``accuracy_before`` / ``accuracy_after``;
``collapsed`` (see ``collapse_reason``: a non-finite loss or a skipped update in any step, or final
accuracy below ``collapse_fraction`` x the starting accuracy); and the per-step statistics averaged
over the run (``STEP_STATS``: mean and second moment of w = π_prox/π_behav, the mean of (log w)²,
the shares of loss tokens capped or masked by each mechanism, the clip fraction, the KL estimates).
``summary``: per (objective, lag, lr) over seeds, the mean and a 95% t-interval of final accuracy,
the collapse rate, and the means of the step statistics.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

from asyncrl.bench.stats import t95 as t_quantile_975  # the one t table (bench/stats.py)

__all__ = ["OBJECTIVES", "STEP_STATS", "collapse_reason", "run_ablation", "summarize", "t_interval"]

OBJECTIVES: dict[str, list[str]] = {
    "decoupled": ["algo.prox_mode=recompute"],
    "loglinear": ["algo.prox_mode=loglinear"],
    "naive": ["algo.prox_mode=behav"],
    "uncorrected": ["algo.loss_type=pg", "algo.prox_mode=behav", "algo.behav_cap=null"],
    "seq_tis": ["algo.prox_mode=recompute", "algo.behav_cap=2.0", "algo.behav_cap_level=sequence",
                "algo.behav_cap_mode=clamp"],
    "seq_mis": ["algo.prox_mode=recompute", "algo.behav_cap=2.0", "algo.behav_cap_level=sequence",
                "algo.behav_cap_mode=mask"],
    "m2po": ["algo.prox_mode=recompute", "algo.m2_threshold=0.04", "algo.behav_cap=null"],
    "version_gap": ["algo.prox_mode=recompute", "algo.max_version_gap=2"],
}  # fmt: skip
"""The config overrides of each objective (the user's ``--set`` comes after them and wins)."""

DEFAULT_OBJECTIVES = ("decoupled", "loglinear", "naive", "uncorrected", "seq_tis", "seq_mis", "m2po")
DEFAULT_LAGS = (0, 1, 2, 4, 8, 16)

STEP_STATS = (
    "behav_weight_mean", "behav_weight_sq_mean", "log_behav_weight_sq_mean", "behav_weight_max",
    "behav_capped_frac", "dropped_frac", "version_gap_masked_frac", "m2_masked_frac", "clip_frac",
    "approx_kl_prox", "approx_kl_behav", "grad_norm",
)  # fmt: skip
"""Per-step trainer metrics averaged over a run (``*_max``: the largest); absent ones are skipped."""

def t_interval(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% t-interval) of ``values``; the half-width is NaN for one value."""
    if not values:
        return math.nan, math.nan
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan
    return mean, t_quantile_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def collapse_reason(metrics: list[dict[str, Any]], before: float, after: float | None, fraction: float) -> str | None:
    """Why a run counts as collapsed, or None: a step with a non-finite loss (logged as null) or a
    skipped update, no final accuracy, or final accuracy below ``fraction`` x the starting one."""
    for m in metrics:
        if m.get("loss") is None or not math.isfinite(float(m["loss"])) or m.get("skipped"):
            return f"non-finite step {m.get('step')}"
    if after is None or not math.isfinite(after):
        return "no final accuracy"
    if after < fraction * before:
        return f"accuracy {after:.3f} < {fraction} x {before:.3f}"
    return None


def _step_means(metrics: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in STEP_STATS:
        values = [float(m[key]) for m in metrics if isinstance(m.get(key), int | float)]
        if values:
            out[key] = max(values) if key.endswith("_max") else statistics.fmean(values)
    return out


def _run(overrides: list[str], run_dir: Path, collapse_fraction: float) -> dict[str, Any]:
    """One training run: its accuracy, collapse flag and averaged step statistics."""
    from asyncrl.config import load_config
    from asyncrl.controller.rundir import check_one_run, read_jsonl
    from asyncrl.launch.local import train

    cfg = load_config(None, [*overrides, f"run.run_dir={run_dir}", "run.progress=false"])
    t0 = time.perf_counter()
    _, summary = train(cfg)  # refuses a run_dir that already holds a run
    check_one_run(run_dir)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    before, after = summary["accuracy_before"], summary["accuracy_after"]
    reason = collapse_reason(metrics, before, after, collapse_fraction)
    return {
        "accuracy_before": before, "accuracy_after": after,
        "accuracy_greedy_after": summary.get("accuracy_greedy_after"),
        "collapsed": reason is not None, "collapse_reason": reason,
        "steps": summary["steps"], "skipped_steps": summary["skipped_steps"],
        "staleness_mean": statistics.fmean([m["staleness_mean"] for m in metrics]) if metrics else 0.0,
        "max_staleness_seen": summary["max_staleness_seen"],
        **_step_means(metrics),
        "rl_wall_s": summary["rl_wall_s"], "wall_s": time.perf_counter() - t0, "run_dir": str(run_dir),
    }  # fmt: skip


def arm_overrides(objective: str, lag: int, lr: float, seed: int, steps: int | None, user: list[str]) -> list[str]:
    """The config overrides of one arm: the controlled-staleness setting, the objective's own keys,
    then the user's ``--set`` (which wins)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r} (available: {', '.join(OBJECTIVES)})")
    out = [
        f"controller.fixed_lag={lag}", f"controller.max_staleness={lag}", "algo.filter_equal_rewards=false",
        "controller.eval_every=0", "controller.checkpoint_every=0", f"trainer.lr={lr}", f"run.seed={seed}",
        *OBJECTIVES[objective],
    ]  # fmt: skip
    if steps is not None:
        out.append(f"controller.total_steps={steps}")
    return [*out, *user]


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (objective, lag, lr) over seeds: final accuracy's mean and 95% t-interval (half-width
    and bounds), the collapse rate, and the means of the step statistics."""
    out = []
    for key in dict.fromkeys((r["objective"], r["lag"], r["lr"]) for r in rows):
        cell = [r for r in rows if (r["objective"], r["lag"], r["lr"]) == key]
        acc = [r["accuracy_after"] for r in cell if r["accuracy_after"] is not None]
        mean, half = t_interval(acc)
        ok = math.isfinite(half)  # one seed: no interval (None in the JSON)
        item: dict[str, Any] = {
            "objective": key[0], "lag": key[1], "lr": key[2], "seeds": [r["seed"] for r in cell], "n": len(acc),
            "accuracy_after_mean": mean if acc else None, "accuracy_after_ci95_half": half if ok else None,
            "accuracy_after_ci95": [mean - half, mean + half] if ok else None,
            "accuracy_before_mean": statistics.fmean([r["accuracy_before"] for r in cell]),
            "collapse_rate": sum(r["collapsed"] for r in cell) / len(cell),
        }  # fmt: skip
        for stat in STEP_STATS:
            values = [r[stat] for r in cell if stat in r]
            if values:
                item[stat] = statistics.fmean(values)
        out.append(item)
    return out


def _print_table(title: str, rows: list[dict[str, Any]], keys: list[str]) -> None:
    print(f"\n{title}")
    print("  ".join(f"{k:>16}" for k in keys))
    for row in rows:
        cells = [f"{row.get(k):>16.4f}" if isinstance(row.get(k), float) else f"{row.get(k)!s:>16}" for k in keys]
        print("  ".join(cells))


def run_ablation(
    json_path: str | None,
    *,
    overrides: list[str] | None = None,
    objectives: tuple[str, ...] = DEFAULT_OBJECTIVES,
    lags: tuple[int, ...] = DEFAULT_LAGS,
    lrs: tuple[float, ...] | None = None,
    seeds: tuple[int, ...] = (0, 1, 2),
    steps: int | None = None,
    collapse_fraction: float = 0.5,
    out_dir: str = "runs/bench-ablation",
) -> dict[str, Any]:
    """The grid (module docstring); prints the rows and the summary and, with ``json_path``, writes
    ``{"bench": "ablation", "rows", "summary", ...}``. ``lrs`` None: the config's ``trainer.lr``."""
    from asyncrl.config import load_config
    from asyncrl.controller.rundir import fresh_subdir

    user = list(overrides or [])
    unknown = [o for o in objectives if o not in OBJECTIVES]
    if unknown:
        raise ValueError(f"unknown objective(s) {unknown} (available: {', '.join(OBJECTIVES)})")
    if lrs is None:
        lrs = (load_config(None, user).trainer.lr,)
    for lag in lags:  # fail before the first run on a bad combination
        load_config(None, arm_overrides(objectives[0], lag, lrs[0], seeds[0], steps, user))
    out = fresh_subdir(out_dir)
    print(f"bench ablation: run directories under {out}", flush=True)
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        for lr in lrs:
            for lag in lags:
                for objective in objectives:
                    print(f"\n=== bench ablation: seed {seed}, lr {lr:g}, lag {lag}, {objective} ===", flush=True)
                    arm = arm_overrides(objective, lag, lr, seed, steps, user)
                    run_dir = out / f"s{seed}-lr{lr:g}-lag{lag}-{objective}"
                    row = {"objective": objective, "lag": lag, "lr": lr, "seed": seed}
                    row.update(_run(arm, run_dir, collapse_fraction))
                    rows.append(row)
    summary = summarize(rows)
    keys = ["objective", "lag", "lr", "seed", "accuracy_before", "accuracy_after", "collapsed",
            "behav_weight_mean", "behav_weight_sq_mean", "clip_frac", "dropped_frac", "rl_wall_s"]  # fmt: skip
    _print_table("bench ablation: runs", rows, keys)
    keys = ["objective", "lag", "lr", "n", "accuracy_after_mean", "accuracy_after_ci95_half", "collapse_rate",
            "behav_weight_sq_mean", "behav_capped_frac", "clip_frac"]  # fmt: skip
    _print_table("bench ablation: over seeds (95% t-interval)", summary, keys)
    payload = {
        "bench": "ablation", "overrides": user, "objectives": {o: OBJECTIVES[o] for o in objectives},
        "lags": list(lags), "lrs": list(lrs), "seeds": list(seeds), "steps": steps,
        "collapse_fraction": collapse_fraction, "rows": rows, "summary": summary, "out_dir": str(out),
    }  # fmt: skip
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(payload, indent=2))
        print(f"\nwrote {json_path}")
    return payload
