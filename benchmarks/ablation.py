"""``python -m benchmarks ablation``: off-policy objectives under controlled staleness (DESIGN §8).

Every row is a real training run (``launch.local.train``, in this process, one after the other,
each in its own run directory under a fresh ``--out``/<timestamp>/) with ``controller.fixed_lag = k``: step i trains on
samples generated entirely by version max(0, i - k), whatever the machine's speed, so the lag and
not the load decides staleness. Every group generated is trained (``algo.filter_equal_rewards=false``),
so all arms at the same seed train the same prompts in the same order, at every lag.

``--staleness bounded`` (``STALENESS_MODES``) runs the same grid as ordinary asynchronous training instead:
no fixed lag, ``controller.max_staleness = k``, so each batch mixes versions and the load decides how
stale it is within the bound (its ``staleness_mean`` is in the row); arms no longer see the same
staleness, and a lag-0 arm is synchronous training. Run directories are then named ``bounded-...``.

Grid: objectives (``OBJECTIVES``) x lags x learning rates x seeds, run seed-major (then lr, lag,
objective), so that load drift over the sweep hits every arm alike. Objectives:

- ``decoupled``: decoupled PPO, the proximal policy recomputed (``algo.prox_mode=recompute``);
- ``loglinear``: the proximal policy approximated from the stored versions (no extra forward);
- ``naive``: naive PPO, the behaviour policy as the clip centre (``algo.prox_mode=behav``);
- ``decoupled_uncapped``: decoupled PPO with the behaviour weight uncapped (``algo.behav_cap=null``: the
  AReaL paper's setting);
- ``prox_clip``: the clip around the recomputed π_prox and no behaviour weight at all
  (``algo.behav_weight=false``, ``behav_cap=null``: AReaL's ``rejection_sampling=None``);
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

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any, Literal, get_args

from asyncrl.config import ConfigError, load_config
from asyncrl.results import write_with_plot
from benchmarks import options
from benchmarks.options import (
    add_json,
    add_out,
    add_overrides,
    add_reanalyse,
    add_reuse,
    add_seeds,
    add_steps,
    parse_list,
)
from benchmarks.runs import print_table, resolve_run_dir, reusable_run, train_or_stop
from benchmarks.stats import t95 as t_quantile_975  # the one t table (benchmarks/stats.py)

__all__ = [
    "add_arguments",
    "collapse_reason",
    "CURVE_KEYS",
    "OBJECTIVES",
    "paired_differences",
    "plot_ablation",
    "PLOTTED",
    "reanalyse",
    "run",
    "run_arm",
    "run_ablation",
    "STALENESS_MODES",
    "StalenessMode",
    "STEP_STATS",
    "summarize",
    "t_interval",
]

StalenessMode = Literal["fixed", "bounded"]
STALENESS_MODES: tuple[str, ...] = get_args(StalenessMode)

OBJECTIVES: dict[str, list[str]] = {
    "decoupled": ["algo.prox_mode=recompute"],
    "loglinear": ["algo.prox_mode=loglinear"],
    "naive": ["algo.prox_mode=behav"],
    "decoupled_uncapped": ["algo.prox_mode=recompute", "algo.behav_cap=null"],
    "prox_clip": ["algo.prox_mode=recompute", "algo.behav_weight=false", "algo.behav_cap=null"],
    "uncorrected": ["algo.loss_type=pg", "algo.prox_mode=behav", "algo.behav_cap=null"],
    "seq_tis": [
        "algo.prox_mode=recompute",
        "algo.behav_cap=2.0",
        "algo.behav_cap_level=sequence",
        "algo.behav_cap_mode=clamp",
    ],
    "seq_mis": [
        "algo.prox_mode=recompute",
        "algo.behav_cap=2.0",
        "algo.behav_cap_level=sequence",
        "algo.behav_cap_mode=mask",
    ],
    "m2po": ["algo.prox_mode=recompute", "algo.m2_threshold=0.04", "algo.behav_cap=null"],
    "version_gap": ["algo.prox_mode=recompute", "algo.max_version_gap=2"],
}
"""The config overrides of each objective (the user's ``--set`` comes after them and wins)."""

DEFAULT_OBJECTIVES = ("decoupled", "loglinear", "naive", "uncorrected", "seq_tis", "seq_mis", "m2po")
DEFAULT_LAGS = (0, 1, 2, 4, 8, 16)

STEP_STATS = (
    "behav_weight_mean",
    "behav_weight_sq_mean",
    "log_behav_weight_sq_mean",
    "behav_weight_max",
    "behav_capped_frac",
    "dropped_frac",
    "version_gap_masked_frac",
    "m2_masked_frac",
    "clip_frac",
    "approx_kl_prox",
    "approx_kl_behav",
    "grad_norm",
    "applied_weight_mean",
    "applied_weight_sq_mean",
    "applied_weight_max",
    "applied_clip_frac",
)
"""Per-step trainer metrics averaged over a run (``*_max``: the largest); absent ones are skipped. ``applied_*``:
the behaviour weight after the cap, the factor the gradient really sees (``algo.losses.policy_loss``)."""

CURVE_KEYS = ("reward", "response_len", "approx_kl_behav", "behav_weight_sq_mean", "clip_frac", "dropped_frac")
"""Per-step metrics kept whole in each row (``curves``), to show *when* an arm drifts or collapses."""

REFERENCE_OBJECTIVE = "decoupled"
"""The objective every other one is compared with, seed by seed (``paired_differences``)."""


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


def _curves(metrics: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    """``CURVE_KEYS`` step by step (None where a step lacks one), rounded to keep the JSON small."""
    out: dict[str, list[float | None]] = {}
    for key in CURVE_KEYS:
        values = [m.get(key) for m in metrics]
        if any(isinstance(v, int | float) for v in values):
            out[key] = [round(float(v), 5) if isinstance(v, int | float) else None for v in values]
    return out


def _row(run_dir: Path, collapse_fraction: float) -> dict[str, Any]:
    """A finished run's row: its accuracy, collapse flag and averaged step statistics, all read from
    the run directory (``summary.json``, ``metrics.jsonl``)."""
    from asyncrl.controller.run_claim import check_one_run, read_jsonl

    check_one_run(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    before, after = summary["accuracy_before"], summary["accuracy_after"]
    reason = collapse_reason(metrics, before, after, collapse_fraction)
    return {
        "accuracy_before": before,
        "accuracy_after": after,
        "accuracy_greedy_after": summary.get("accuracy_greedy_after"),
        "collapsed": reason is not None,
        "collapse_reason": reason,
        "steps": summary["steps"],
        "skipped_steps": summary["skipped_steps"],
        "staleness_mean": statistics.fmean([m["staleness_mean"] for m in metrics]) if metrics else 0.0,
        "max_staleness_seen": summary["max_staleness_seen"],
        **_step_means(metrics),
        "curves": _curves(metrics),
        "rl_wall_s": summary["rl_wall_s"],
        "wall_s": summary["wall_s"],
        "run_dir": str(run_dir),
        "code": summary.get("code"),  # which code made the run (absent in runs from before it was recorded)
    }


def run_arm(overrides: list[str], run_dir: Path, collapse_fraction: float, reuse: Path | None) -> dict[str, Any]:
    """One training run's row (``_row``); with ``reuse``, a finished run of the same arm under that
    directory (same name, same config: ``runs.reusable_run``) is read instead of trained again."""
    from asyncrl.config import load_config

    if reuse is not None and reusable_run(overrides, reuse / run_dir.name):
        print(f"bench ablation: reusing the finished run {reuse / run_dir.name}", flush=True)
        return {**_row(reuse / run_dir.name, collapse_fraction), "reused": True}
    train_or_stop(load_config(None, [*overrides, f"run.run_dir={run_dir}", "run.progress=false"]))  # refuses a used dir
    return _row(run_dir, collapse_fraction)


def arm_overrides(
    objective: str,
    lag: int,
    lr: float,
    seed: int,
    steps: int | None,
    user: list[str],
    staleness: StalenessMode = "fixed",
) -> list[str]:
    """The config overrides of one arm: the staleness setting (``fixed``: ``controller.fixed_lag = lag``;
    ``bounded``: ordinary asynchronous training with ``controller.max_staleness = lag``), the objective's
    own keys, then the user's ``--set`` (which wins)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r} (available: {', '.join(OBJECTIVES)})")
    match staleness:
        case "fixed":
            out = [f"controller.fixed_lag={lag}", f"controller.max_staleness={lag}"]
        case "bounded":
            out = ["controller.fixed_lag=null", f"controller.max_staleness={lag}"]
        case other:
            raise ValueError(f"unknown staleness mode {other!r} (available: {', '.join(STALENESS_MODES)})")
    out += [
        "algo.filter_equal_rewards=false",
        "controller.eval_every=0",
        "controller.checkpoint_every=0",
        f"trainer.lr={lr}",
        f"run.seed={seed}",
        *OBJECTIVES[objective],
    ]
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
            "objective": key[0],
            "lag": key[1],
            "lr": key[2],
            "seeds": [r["seed"] for r in cell],
            "n": len(acc),
            "accuracy_after_mean": mean if acc else None,
            "accuracy_after_ci95_half": half if ok else None,
            "accuracy_after_ci95": [mean - half, mean + half] if ok else None,
            "accuracy_before_mean": statistics.fmean([r["accuracy_before"] for r in cell]),
            "collapse_rate": sum(r["collapsed"] for r in cell) / len(cell),
        }
        for stat in STEP_STATS:
            values = [r[stat] for r in cell if stat in r]
            if values:
                item[stat] = statistics.fmean(values)
        out.append(item)
    return out


def paired_differences(rows: list[dict[str, Any]], reference: str = REFERENCE_OBJECTIVE) -> list[dict[str, Any]]:
    """Per (objective, lag, lr), objective != ``reference``: final accuracy minus the reference's at
    the same seed (same prompts in the same order), its mean and 95% t-interval over the seeds both
    ran. An interval that excludes 0 is a difference larger than the seed spread."""
    by_key = {(r["objective"], r["lag"], r["lr"], r["seed"]): r["accuracy_after"] for r in rows}
    out = []
    for objective, lag, lr in dict.fromkeys((r["objective"], r["lag"], r["lr"]) for r in rows):
        if objective == reference:
            continue
        seeds = [s for (o, k, x, s) in by_key if (o, k, x) == (objective, lag, lr)]
        diffs = [
            by_key[(objective, lag, lr, s)] - by_key[(reference, lag, lr, s)]
            for s in seeds
            if by_key.get((reference, lag, lr, s)) is not None and by_key[(objective, lag, lr, s)] is not None
        ]
        if not diffs:
            continue
        mean, half = t_interval(diffs)
        ok = math.isfinite(half)
        out.append(
            {
                "objective": objective,
                "reference": reference,
                "lag": lag,
                "lr": lr,
                "n": len(diffs),
                "minus_reference_mean": mean,
                "minus_reference_ci95": [mean - half, mean + half] if ok else None,
                "minus_reference_per_seed": diffs,
            }
        )
    return out


def plot_ablation(payload: dict[str, Any], path: Path) -> None:
    """One column per learning rate. Top: final held-out accuracy against lag per objective (mean
    and 95% t-interval over seeds; grey: accuracy before RL). Bottom: the run's mean KL(π_behav ‖
    π_θ) estimate (``approx_kl_behav``), how far the trained policy drifted from the one that sampled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, lrs = payload["summary"], payload["lrs"]
    fig, axes = plt.subplots(2, len(lrs), figsize=(5.5 * len(lrs), 7.5), squeeze=False, sharex=True)
    objectives = list(dict.fromkeys(s["objective"] for s in summary))
    for col, lr in enumerate(lrs):
        top, bottom = axes[0][col], axes[1][col]
        for i, objective in enumerate(objectives):
            cells = [s for s in summary if s["objective"] == objective and s["lr"] == lr]
            cells.sort(key=lambda s: s["lag"])
            lags = [s["lag"] + 0.08 * (i - len(objectives) / 2) for s in cells]  # side by side
            means = [s["accuracy_after_mean"] for s in cells]
            errs = [s["accuracy_after_ci95_half"] or 0.0 for s in cells]
            top.errorbar(lags, means, yerr=errs, marker="o", capsize=3, label=objective)
            bottom.plot(lags, [s.get("approx_kl_behav", math.nan) for s in cells], marker="o", label=objective)
        before = [s["accuracy_before_mean"] for s in summary if s["lr"] == lr]
        if before:
            top.axhline(statistics.fmean(before), color="grey", lw=0.8, ls="--")
        top.set_title(f"lr {lr:g}")
        top.set_ylabel("final held-out accuracy (95% CI)")
        bottom.set_ylabel("mean approx KL(behav ‖ trained)")
        bottom.set_yscale("log")
        bottom.set_xlabel("lag k (versions)")
        top.legend(fontsize=8)
    from asyncrl.controller.report import save_figure

    save_figure(fig, path)


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
    reuse: str | None = None,
    staleness: StalenessMode = "fixed",
) -> dict[str, Any]:
    """The grid (module docstring); prints the rows and the summary and, with ``json_path``, writes
    ``{"bench": "ablation", "rows", "summary", ...}``. ``lrs`` None: the config's ``trainer.lr``.
    ``reuse``: the run directory of an earlier, interrupted invocation (``<out>/<timestamp>``): its
    finished arms with the same config are read, not run again (their rows say ``reused``).
    ``staleness``: ``fixed`` (a controlled lag) or ``bounded`` (ordinary asynchronous training, module docstring)."""
    from asyncrl.config import load_config
    from asyncrl.controller.run_claim import fresh_subdir

    user = list(overrides or [])
    unknown = [o for o in objectives if o not in OBJECTIVES]
    if unknown:
        raise ValueError(f"unknown objective(s) {unknown} (available: {', '.join(OBJECTIVES)})")
    if lrs is None:
        lrs = (load_config(None, user).trainer.lr,)
    for lag in lags:  # fail before the first run on a bad combination
        load_config(None, arm_overrides(objectives[0], lag, lrs[0], seeds[0], steps, user, staleness))
    out = fresh_subdir(out_dir)
    print(f"bench ablation: run directories under {out}", flush=True)
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        for lr in lrs:
            for lag in lags:
                for objective in objectives:
                    title = f"bench ablation ({staleness}): seed {seed}, lr {lr:g}, lag {lag}, {objective}"
                    print(f"\n=== {title} ===", flush=True)
                    arm = arm_overrides(objective, lag, lr, seed, steps, user, staleness)
                    prefix = "bounded-" if staleness == "bounded" else ""
                    run_dir = out / f"{prefix}s{seed}-lr{lr:g}-lag{lag}-{objective}"
                    row = {"objective": objective, "lag": lag, "lr": lr, "seed": seed}
                    row.update(run_arm(arm, run_dir, collapse_fraction, Path(reuse) if reuse else None))
                    rows.append(row)
    keys = [
        "objective",
        "lag",
        "lr",
        "seed",
        "accuracy_before",
        "accuracy_after",
        "collapsed",
        "behav_weight_mean",
        "behav_weight_sq_mean",
        "clip_frac",
        "dropped_frac",
        "rl_wall_s",
    ]
    print_table("bench ablation: runs", rows, keys, width=16, digits=4)
    payload = {
        "bench": "ablation",
        "staleness": staleness,
        "overrides": user,
        "objectives": {o: OBJECTIVES[o] for o in objectives},
        "lags": list(lags),
        "lrs": list(lrs),
        "seeds": list(seeds),
        "steps": steps,
        "collapse_fraction": collapse_fraction,
        "rows": rows,
        "out_dir": str(out),
        "reused_from": reuse,
    }
    return _finish(payload, json_path)


def _finish(payload: dict[str, Any], json_path: str | None, *, replace: bool = False) -> dict[str, Any]:
    """Summary and paired differences from the rows; print them; write the JSON and its plot (never over a
    file: ``output.write_with_plot``; ``replace``: ``--reanalyse``, the previous file kept beside)."""
    payload["summary"] = summarize(payload["rows"])
    payload["paired_differences"] = paired_differences(payload["rows"])
    keys = [
        "objective",
        "lag",
        "lr",
        "n",
        "accuracy_after_mean",
        "accuracy_after_ci95_half",
        "collapse_rate",
        "behav_weight_sq_mean",
        "behav_capped_frac",
        "clip_frac",
        "approx_kl_behav",
    ]
    print_table("bench ablation: over seeds (95% t-interval)", payload["summary"], keys, width=16, digits=4)
    keys = ["objective", "lag", "lr", "n", "minus_reference_mean", "minus_reference_ci95"]
    title = f"bench ablation: minus {REFERENCE_OBJECTIVE}, seed by seed"
    print_table(title, payload["paired_differences"], keys, width=16, digits=4)
    if json_path:
        write_with_plot(
            json_path, json.dumps(payload, indent=2), lambda png: plot_ablation(payload, png), replace=replace
        )
    return payload


def reanalyse(json_path: str) -> dict[str, Any]:
    """Recompute a finished ablation JSON in place (the previous file kept beside it): each row's step
    statistics and curves from its run directory where it still exists (``runs.resolve_run_dir``; the rows as
    written otherwise), then the summary, the paired differences and the plot, without training anything again;
    records that it did."""
    from asyncrl.controller.rundir import read_jsonl

    payload = json.loads(Path(json_path).read_text())
    for row in payload["rows"]:
        try:
            metrics_file = resolve_run_dir(row["run_dir"], json_path) / "metrics.jsonl"
        except FileNotFoundError:
            continue  # gone: the row as written
        if metrics_file.is_file():
            metrics = read_jsonl(metrics_file)
            row.update(_step_means(metrics))
            row["curves"] = _curves(metrics)
    payload.setdefault("reanalysed", []).append(time.strftime("%Y-%m-%d %H:%M:%S"))
    return _finish(payload, json_path, replace=True)


PLOTTED = True
"""The plot is written beside the result file (its ``.png``)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The grid (``--objectives``, ``--lags``, ``--lrs``, ``--seeds``, ``--staleness``), the runs (``--set``,
    ``--model``, ``--steps``, ``--out``, ``--reuse``), ``--collapse-fraction`` and ``--reanalyse``."""
    add_json(parser)
    add_overrides(parser)
    add_steps(parser)
    parser.add_argument("--lags", help="comma-separated controller.fixed_lag values (default 0,1,2,4,8,16)")
    parser.add_argument(
        "--objectives",
        help=f"comma-separated objectives (default {','.join(DEFAULT_OBJECTIVES)}; available: {', '.join(OBJECTIVES)})",
    )
    parser.add_argument("--lrs", help="comma-separated trainer.lr values (default: the config's)")
    add_seeds(parser, "0,1,2")
    parser.add_argument(
        "--staleness",
        default="fixed",
        help="fixed (controller.fixed_lag = each lag, the default) or bounded "
        "(ordinary asynchronous training, controller.max_staleness = each lag)",
    )
    parser.add_argument(
        "--collapse-fraction",
        type=float,
        default=0.5,
        help="a run whose final accuracy is below this x its starting accuracy counts as collapsed (default 0.5)",
    )
    add_out(parser, "runs/bench-ablation")
    add_reuse(parser)
    add_reanalyse(parser)


def run(args: argparse.Namespace) -> None:
    """``--reanalyse FILE``, or the grid checked (every arm's learning rate included), then every run."""
    if args.reanalyse:
        reanalyse(args.reanalyse)
        return
    base = options.overrides(args)
    objectives = tuple(args.objectives.split(",")) if args.objectives else DEFAULT_OBJECTIVES
    unknown = [o for o in objectives if o not in OBJECTIVES]
    if unknown:
        raise ConfigError(f"unknown objective(s) {unknown} (available: {', '.join(OBJECTIVES)})")
    lags = parse_list(args.lags, int, DEFAULT_LAGS, "--lags")
    lrs = parse_list(args.lrs, float, (), "--lrs") or None
    seeds = parse_list(args.seeds, int, (0, 1, 2), "--seeds")
    for lr in lrs or ():  # each arm's learning rate checked now, not when its first run starts
        load_config(None, [*base, f"trainer.lr={lr!r}"])
    if args.staleness not in STALENESS_MODES:
        raise ConfigError(f"--staleness {args.staleness!r} (available: {', '.join(STALENESS_MODES)})")
    run_ablation(
        args.json,
        overrides=base,
        objectives=objectives,
        lags=lags,
        lrs=lrs,
        seeds=seeds,
        steps=args.steps,
        collapse_fraction=args.collapse_fraction,
        staleness=args.staleness,
        out_dir=args.out,
        **({"reuse": args.reuse} if args.reuse else {}),
    )
