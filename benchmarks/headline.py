"""``python -m benchmarks headline``: time to a target held-out accuracy, asynchronous against the best
synchronous arm (the AReaL paper's headline claim, measured on this machine).

One invocation, seed-major (every arm of a seed runs back to back, so load drift hits all arms):

1. **The synchronous arm's setting.** ``max_staleness = 0`` is run once per candidate of
   ``SYNC_CANDIDATES`` (seed ``seeds[0]``, ``probe_steps`` steps) and the one with the highest
   whole-run trained tokens/s becomes the synchronous arm: a baseline is never handicapped (with
   nothing overlapping, generation and training may each use both cores).
2. **The arms.** ``max_staleness`` in ``etas`` (0 at the winning setting; the others as the local
   launcher runs asynchronously: engine thread and trainer process, one core each), the same
   steps (or, with ``time_budget_s``, the same RL wall-time budget), data order and seed. Each run
   saves its published policy every ``snapshot_every_s`` seconds of RL time
   (``controller.snapshot_every_s``) with its version and time.
3. **Evaluation afterwards.** Every snapshot is evaluated on the held-out split (``eval.*``)
   once all runs are done, so measuring accuracy costs a run only the saves (milliseconds each).
4. **The numbers.** Per seed, the target is the synchronous run's starting accuracy plus
   ``target_fraction`` of its gain over the run (start -> final snapshot); each arm's time to the
   target (``stats.time_to_target``: reached and held at the next evaluation, interpolated);
   the speed-up ``T_sync / T_arm`` per seed, and its mean with a 95% t-interval; beside it the same
   by the first crossing of the target, held or not (``speedup_first_crossing``); final accuracies
   side by side with the paired difference to the synchronous run, and both runs' accuracy at equal
   wall time (when the shorter of the two ended: equal step budgets end the arms at different times);
   the throughput of each run
   (``throughput.measure_throughput``: steady state and whole run). A plot of accuracy against
   wall time for every arm and seed is written beside the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from asyncrl.config import ConfigError
from asyncrl.controller.run_claim import fresh_subdir
from asyncrl.controller.throughput import measure_throughput
from asyncrl.controller.time_budget import time_budget
from asyncrl.data.workloads import WORKLOAD_ALIASES, WORKLOADS
from asyncrl.results import write_with_plot
from benchmarks import options, tuning
from benchmarks.async_bench import workload_overrides
from benchmarks.options import (
    add_json,
    add_out,
    add_overrides,
    add_reanalyse,
    add_reuse,
    add_seeds,
    add_steps,
    add_warmup,
    parse_list,
)
from benchmarks.runs import measure_or_reuse, resolve_run_dir, run_and_measure
from benchmarks.stats import accuracy_at, mean_ci95, time_to_target

__all__ = [
    "add_arguments",
    "analyse",
    "evaluate_snapshots",
    "finish",
    "PLOTTED",
    "reanalyse",
    "run",
    "run_headline_bench",
    "SAMPLES_KEY",
    "SYNC_CANDIDATES",
    "with_samples_per_prompt",
]

SYNC_CANDIDATES: dict[str, list[str]] = {
    "threads1-trainer-process": ["run.torch_threads=1", "controller.trainer_process=true"],
    "threads2-trainer-process": ["run.torch_threads=2", "controller.trainer_process=true"],
    "threads2-one-process": ["run.torch_threads=2", "controller.trainer_process=false"],
}
"""The reasonable synchronous settings: how many intra-op threads each phase gets, and whether
the trainer runs in its own process (no weights or batches cross a pipe) or in the engine's."""

PLATEAU_WINDOW = 3
"""The sensitivity check's synchronous final accuracy: the mean of the run's last three evaluations
(its plateau), and every arm's final accuracy the same way."""

ASYNC_SETTING = ["run.torch_threads=1", "controller.trainer_process=true"]
"""The asynchronous arms: engine and trainer overlap, one core each (DESIGN §6)."""


SAMPLES_KEY = "eval.samples_per_prompt"
"""The setting a snapshot's score is drawn with (``--samples-per-prompt``)."""


def with_samples_per_prompt(overrides: Sequence[str], samples_per_prompt: int) -> list[str]:
    """``overrides`` with ``eval.samples_per_prompt`` set to ``samples_per_prompt`` (replaced, not added)."""
    return [o for o in overrides if not o.startswith(f"{SAMPLES_KEY}=")] + [f"{SAMPLES_KEY}={samples_per_prompt}"]


def evaluate_snapshots(overrides: list[str], snapshots: list[dict[str, Any]]) -> list[float]:
    """Held-out accuracy of each snapshot (the run's ``eval.*`` settings, every core); the engine and
    the evaluator are built as ``asyncrl eval`` builds them."""
    from asyncrl.config import load_config
    from asyncrl.data.prompts import build_task, drop_long_prompts
    from asyncrl.launch.stages import build_engine, configure_threads, evaluate_once, load_model, usable_cores
    from asyncrl.models import stop_token_ids

    cfg = load_config(None, overrides)
    configure_threads(cfg, usable_cores())
    held_out: list[Any] | None = None
    out = []
    for snap in snapshots:
        model, tok = load_model(cfg, snap["path"])
        if held_out is None:  # every snapshot of a run shares the tokenizer
            held_out = drop_long_prompts(build_task(cfg.task, tok)[1], cfg.rollout.max_prompt_len, "held-out prompts")
        engine = build_engine(cfg, model, tok)
        try:
            result = asyncio.run(evaluate_once(cfg, engine, held_out, tok, stop_token_ids(tok, model)))
        finally:
            engine.close()
        out.append(result["accuracy"])
    return out


TIME_BUDGET_SUMMARY = ("engine_decode_frac", "mean_engine_running", "trainer_busy_frac", "early_response_len")
"""``time_budget`` figures averaged per arm in the summary (where the time went)."""


def _arm_name(eta: int) -> str:
    return f"eta{eta}"


def _final_accuracy(curve: list[tuple[float, float]], final_window: int) -> float:
    """The mean accuracy of a run's last ``final_window`` evaluations after its start (the start
    alone when it has no other)."""
    last = [acc for _t, acc in curve[1:][-final_window:]] or [curve[0][1]]
    return sum(last) / len(last)


def analyse(
    rows: list[dict[str, Any]], target_fraction: float, eval_samples: int = 0, final_window: int = 1
) -> dict[str, Any]:
    """Targets, times to target, speed-ups and accuracy differences from evaluated rows (each row:
    ``seed``, ``max_staleness``, ``curve`` [(t, accuracy)], throughput fields). ``eval_samples``:
    scored samples per evaluation, for the standard error of the synchronous run's gain (a seed
    whose gain is within two standard errors has no meaningful target, and says so).
    ``final_window``: the synchronous run's final accuracy is the mean of its last ``final_window``
    evaluations (1: the last one, the pre-registered rule; more: a plateau, less sensitive to one
    evaluation of a run that peaked before its end)."""
    if final_window < 1:
        raise ValueError(f"final_window must be >= 1, got {final_window}")
    by_seed: dict[int, dict[int, dict[str, Any]]] = {}
    for row in rows:
        by_seed.setdefault(row["seed"], {})[row["max_staleness"]] = row
        # every row's figures are this analysis's, a seed without a synchronous run included
        row["final_accuracy"] = _final_accuracy(row["curve"], final_window) if row["curve"] else None
        row["time_to_target_s"] = None
    per_seed = []
    for seed, arms in sorted(by_seed.items()):
        sync = arms.get(0)
        if sync is None or not sync["curve"]:
            continue
        start, final = sync["curve"][0][1], _final_accuracy(sync["curve"], final_window)
        target = start + target_fraction * (final - start)
        t_sync = time_to_target(sync["curve"], target)
        t_sync_first = time_to_target(sync["curve"], target, hold=False)
        samples = eval_samples * min(final_window, max(1, len(sync["curve"]) - 1))
        se = math.sqrt(start * (1 - start) / eval_samples + final * (1 - final) / samples) if eval_samples else None
        item: dict[str, Any] = {
            "seed": seed,
            "target_accuracy": target,
            "sync_start": start,
            "sync_final": final,
            "sync_gain_se": se,
            "target_meaningful": se is None or final - start > 2 * se,
            # a synchronous run that never holds its own target (a plateau above its end) gives no speed-up
            "sync_holds_target": math.isfinite(t_sync),
        }
        for eta, row in sorted(arms.items()):
            if not row["curve"]:  # a run with no evaluated snapshot says nothing of time or accuracy
                continue
            t_arm = time_to_target(row["curve"], target)
            row["time_to_target_s"] = t_arm
            item[f"{_arm_name(eta)}_reached"] = math.isfinite(t_arm)
            item[f"{_arm_name(eta)}_time_to_target_s"] = t_arm
            if math.isfinite(t_sync):
                item[f"{_arm_name(eta)}_speedup"] = t_sync / t_arm if t_arm > 0 and math.isfinite(t_arm) else 0.0
            # the other rule: the first crossing of the target, held or not (a run that jumps above it and back
            # counts from its first jump)
            t_first = time_to_target(row["curve"], target, hold=False)
            item[f"{_arm_name(eta)}_first_crossing_s"] = t_first
            if math.isfinite(t_sync_first):
                item[f"{_arm_name(eta)}_speedup_first_crossing"] = (
                    t_sync_first / t_first if t_first > 0 and math.isfinite(t_first) else 0.0
                )
            item[f"{_arm_name(eta)}_final_minus_sync_points"] = 100 * (row["final_accuracy"] - final)
            # at equal wall time: both runs' accuracy when the shorter one ended (a step budget ends them apart)
            common_end = min(row["curve"][-1][0], sync["curve"][-1][0])
            item[f"{_arm_name(eta)}_common_end_s"] = common_end
            item[f"{_arm_name(eta)}_at_common_end_minus_sync_points"] = 100 * (
                accuracy_at(row["curve"], common_end) - accuracy_at(sync["curve"], common_end)
            )
            for key in ("steady_state_tokens_per_s", "trained_tokens_per_s"):
                if row.get(key) is not None and sync.get(key):
                    item[f"{_arm_name(eta)}_{key}_ratio"] = row[key] / sync[key]
        per_seed.append(item)
    summary: dict[str, Any] = {}
    for eta in sorted({r["max_staleness"] for r in rows}):
        name = _arm_name(eta)

        def over_seeds(key: str, name: str = name) -> list[float]:
            return [s[f"{name}_{key}"] for s in per_seed if f"{name}_{key}" in s]

        speedups = over_seeds("speedup")
        reached = [v for v in speedups if v > 0]
        first = over_seeds("speedup_first_crossing")
        summary[name] = {
            "speedup": mean_ci95(speedups),
            "speedup_first_crossing": mean_ci95(first),
            "reached_first_crossing": f"{sum(v > 0 for v in first)} of {len(first)}",
            "speedup_geometric_mean_of_reached": math.exp(sum(map(math.log, reached)) / len(reached))
            if reached
            else None,
            "reached": f"{len(reached)} of {len(speedups)}",
            "time_to_target_s": mean_ci95(over_seeds("time_to_target_s")),
            "final_accuracy": mean_ci95(
                [r["final_accuracy"] for r in rows if r["max_staleness"] == eta and r["final_accuracy"] is not None]
            ),
            "seeds_without_synchronous_time": [s["seed"] for s in per_seed if not s["sync_holds_target"]],
            "final_minus_sync_points": mean_ci95(over_seeds("final_minus_sync_points")),
            "at_common_end_minus_sync_points": mean_ci95(over_seeds("at_common_end_minus_sync_points")),
            "steady_state_ratio": mean_ci95(over_seeds("steady_state_tokens_per_s_ratio")),
            "whole_run_ratio": mean_ci95(over_seeds("trained_tokens_per_s_ratio")),
            "staleness_mean": mean_ci95([r["staleness_mean"] for r in rows if r["max_staleness"] == eta]),
        }
        budgets = [r["time_budget"] for r in rows if r["max_staleness"] == eta and r.get("time_budget")]
        for key in TIME_BUDGET_SUMMARY:
            values = [b[key] for b in budgets if b.get(key) is not None]
            if values:
                summary[name][key] = mean_ci95(values)
    return {"per_seed": per_seed, "summary": summary}


def plot_curves(rows: list[dict[str, Any]], path: Path, targets: dict[int, float]) -> None:
    """Held-out accuracy against RL wall time, one line per run (colour: arm, style: seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    etas = sorted({r["max_staleness"] for r in rows})
    colours = dict(zip(etas, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    styles = ["-", "--", ":", "-."]
    seeds = sorted({r["seed"] for r in rows})
    for row in rows:
        t, acc = zip(*row["curve"], strict=True) if row["curve"] else ((), ())
        label = f"η={row['max_staleness']}" if row["seed"] == seeds[0] else None
        ax.plot(
            t, acc, styles[seeds.index(row["seed"]) % 4], color=colours[row["max_staleness"]], marker=".", label=label
        )
    for seed, target in targets.items():
        ax.axhline(target, color="grey", lw=0.6, ls=styles[seeds.index(seed) % 4])
    ax.set_xlabel("RL wall time (s)")
    ax.set_ylabel("held-out accuracy")
    ax.set_title("time to accuracy (grey: each seed's target; line style: seed)")
    ax.legend()
    from asyncrl.controller.report import save_figure

    save_figure(fig, path)


def probe_sync(base: list[str], seed: int, steps: int, out: Path, warmup_s: float) -> tuple[str, list[dict]]:
    """Run each synchronous candidate; the name of the fastest (whole-run trained tokens/s)."""
    probes = []
    for name, extra in SYNC_CANDIDATES.items():
        print(f"\n=== bench headline: synchronous candidate {name} (seed {seed}, {steps} steps) ===", flush=True)
        over = [
            *base,
            *extra,
            f"run.seed={seed}",
            "controller.max_staleness=0",
            f"controller.total_steps={steps}",
            "controller.snapshot_every_s=0",
        ]
        row = run_and_measure(over, out / f"probe-{name}", 0.0)
        probes.append({"candidate": name, "overrides": extra, **{k: v for k, v in row.items() if k != "snapshots"}})
    best = max(probes, key=lambda p: p["trained_tokens_per_s"])
    return best["candidate"], probes


TUNING_KEYS = ("max_staleness", "lr", "seed")
"""What identifies a tuning row: the arm, the step size, the seed."""


def _arm_overrides(base: list[str], setting: list[str], seed: int, eta: int, snapshot_every_s: float) -> list[str]:
    return [
        *base,
        *setting,
        f"run.seed={seed}",
        f"controller.max_staleness={eta}",
        f"controller.snapshot_every_s={snapshot_every_s}",
    ]


def tuning_rows_from(paths: Sequence[str], base: list[str], sync_setting: str) -> dict[tuple, dict[str, Any]]:
    """The finished tuning rows of earlier invocations (``--tuning-from``: their result files or progress files),
    keyed by ``TUNING_KEYS``; ConfigError (one line) for a file that is missing, unreadable or not this bench's,
    or whose runs had other overrides or another synchronous setting."""
    done: dict[tuple, dict[str, Any]] = {}
    for path in paths:
        try:
            payload = json.loads(Path(path).read_text())
            if payload.get("bench") != "headline":
                raise ValueError(f"its bench is {payload.get('bench')!r}")
            rows = list(payload["tuning_rows"])
            keys = [tuple(row[k] for k in TUNING_KEYS) for row in rows]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"--tuning-from {path}: not a headline result or progress file ({exc!r})") from exc
        if payload.get("overrides") != base:
            raise ConfigError(
                f"--tuning-from {path}: its runs were made with {payload.get('overrides')} where this invocation's "
                f"are {base}"
            )
        if payload.get("sync_setting") != sync_setting:
            raise ConfigError(
                f"--tuning-from {path}: its synchronous setting is {payload.get('sync_setting')!r}, this "
                f"invocation's {sync_setting!r}"
            )
        done.update((k, r) for k, r in zip(keys, rows, strict=True) if r.get("accuracy_after") is not None)
    return done


def tune_step_sizes(
    base: list[str],
    etas: Sequence[int],
    lrs: Sequence[float],
    seeds: Sequence[int],
    sync_setting: str,
    out: Path,
    progress: Path,
    done: dict[tuple, dict[str, Any]],
    warmup_s: float,
    reuse: Path | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[int, float]]:
    """Each arm over the step sizes ``lrs`` on the tuning ``seeds`` (seed-major), at the arms' own budget (steps or
    RL time) and setting, without snapshots: its final held-out accuracy. Rows in ``done`` are not made again, nor
    runs finished under ``reuse`` (``measure_or_reuse``); after every run the rows so far are kept in ``progress``.
    Returns the rows, the table per (arm, step size) and each arm's best step size (``tuning.best_lrs``)."""
    rows: list[dict[str, Any]] = []
    cells = [(eta, lr, seed) for seed in seeds for eta in etas for lr in lrs]
    for i, (eta, lr, seed) in enumerate(cells, 1):
        if (eta, lr, seed) in done:
            rows.append({**done[(eta, lr, seed)], "from_tuning_file": True})
            print(
                f"bench headline (tuning {i}/{len(cells)}): eta {eta}, lr {lr:g}, seed {seed} from --tuning-from",
                flush=True,
            )
            continue
        print(
            f"\n=== bench headline (tuning {i}/{len(cells)}): max_staleness={eta}, lr {lr:g}, seed {seed} ===",
            flush=True,
        )
        setting = SYNC_CANDIDATES[sync_setting] if eta == 0 else ASYNC_SETTING
        over = [*_arm_overrides(base, setting, seed, eta, 0.0), f"trainer.lr={lr}"]
        row = measure_or_reuse(over, out / f"tune-s{seed}-eta{eta}-lr{lr:g}", warmup_s, reuse, "headline")
        row.pop("snapshots", None)
        rows.append({"max_staleness": eta, "lr": lr, "seed": seed, **row})
        kept = {"bench": "headline", "overrides": base, "sync_setting": sync_setting, "tuning_rows": rows}
        tuning.write_progress(progress, kept)
    table = tuning.tuning_table(rows, "max_staleness", etas, lrs, seeds)
    print_tuning(table)
    return rows, table, tuning.best_lrs(table, "max_staleness")


def print_tuning(table: list[dict[str, Any]]) -> None:
    print("\nbench headline: tuning (final held-out accuracy over the tuning seeds)")
    for t in table:
        ci = t["accuracy_after_ci95"]
        interval = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
        mean = "-" if t["accuracy_after_mean"] is None else f"{t['accuracy_after_mean']:.3f}"
        print(f"  eta {t['max_staleness']:>2}  lr {t['lr']:<8g}  n {t['n']}  {mean}{interval}")


def run_headline_bench(
    json_path: str | None,
    *,
    overrides: list[str] | None = None,
    workload: str = "reason",
    etas: tuple[int, ...] = (0, 2, 4, 8),
    seeds: tuple[int, ...] = (0, 1, 2),
    steps: int | None = None,
    snapshot_every_s: float = 20.0,
    warmup_s: float = 60.0,
    target_fraction: float = 0.9,
    probe_steps: int = 0,
    sync_setting: str | None = None,
    time_budget_s: float = 0.0,
    snapshot_samples_per_prompt: int | None = None,
    out_dir: str = "runs/bench-headline",
    lrs: Sequence[float] = (),
    tune_seeds: Sequence[int] = (),
    tuning_from: Sequence[str] = (),
    reuse: str | None = None,
) -> dict[str, Any]:
    """The headline benchmark (see the module docstring). ``sync_setting``: a name of
    ``SYNC_CANDIDATES`` to use without probing; ``probe_steps`` 0 with no ``sync_setting``: the
    probe runs as many steps as the arms. ``time_budget_s`` > 0: every arm stops starting steps at
    this much RL time (``controller.max_rl_time_s``; ``steps`` stays a cap), so arms end together
    and an arm that never reaches the target had as long as the synchronous run.
    ``snapshot_samples_per_prompt``: samples per held-out prompt when scoring the snapshots (None:
    the runs' ``eval.samples_per_prompt``, which also scores each run before and after RL).
    ``lrs``: first each arm's step size is tuned over these on ``tune_seeds`` (``tune_step_sizes``; rows of
    ``tuning_from`` files are not made again), then every arm runs at its own best. ``reuse``: an interrupted
    invocation's run directory, whose finished runs (tuning runs and arms alike) with the same config are read, not
    run again (their rows say ``reused``)."""
    workload = WORKLOAD_ALIASES.get(workload, workload)
    base = workload_overrides(list(overrides or []), workload)
    if steps is not None:
        base.append(f"controller.total_steps={steps}")
    if time_budget_s < 0:
        raise ValueError(f"time_budget_s must be >= 0 (0: none), got {time_budget_s}")
    if time_budget_s:
        base.append(f"controller.max_rl_time_s={time_budget_s}")
    scoring = with_samples_per_prompt(base, snapshot_samples_per_prompt) if snapshot_samples_per_prompt else base
    if lrs and json_path:
        tuning.refuse_unnamed_progress(
            tuning.progress_path(json_path, Path("."), "headline"), tuning_from, "--tuning-from"
        )
    if lrs:
        n_tune = len(etas) * len(lrs) * len(tune_seeds)
        print(
            f"bench headline: {n_tune} tuning runs ({len(lrs)} step sizes x {len(etas)} arms x "
            f"{len(tune_seeds)} seeds), then {len(etas) * len(seeds)} arm runs",
            flush=True,
        )
    out = fresh_subdir(out_dir)
    probes: list[dict[str, Any]] = []
    if sync_setting is None:
        from asyncrl.config import load_config

        n_probe = probe_steps or load_config(None, base).controller.total_steps
        sync_setting, probes = probe_sync(base, seeds[0], n_probe, out, warmup_s)
    elif sync_setting not in SYNC_CANDIDATES:
        raise ValueError(f"sync setting {sync_setting!r}: expected one of {', '.join(SYNC_CANDIDATES)}")
    progress = tuning.progress_path(json_path, out, "headline")
    reuse_dir = Path(reuse) if reuse else None
    tuning_rows: list[dict[str, Any]] = []
    tuning_table: list[dict[str, Any]] = []
    best: dict[int, float] = {}
    if lrs:
        done = tuning_rows_from(tuning_from, base, sync_setting)
        tuning_rows, tuning_table, best = tune_step_sizes(
            base, etas, lrs, tune_seeds, sync_setting, out, progress, done, warmup_s, reuse_dir
        )
        print(f"bench headline: best step sizes {best}", flush=True)
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        for eta in etas:
            setting = SYNC_CANDIDATES[sync_setting] if eta == 0 else ASYNC_SETTING
            print(f"\n=== bench headline: {workload}, seed {seed}, max_staleness={eta} ===", flush=True)
            over = _arm_overrides(base, setting, seed, eta, snapshot_every_s)
            if eta in best:
                over.append(f"trainer.lr={best[eta]}")
            row = {
                "workload": workload,
                "seed": seed,
                "max_staleness": eta,
                "setting": sync_setting if eta == 0 else "async",
                "overrides": setting,
                "lr": best.get(eta),
            }
            row.update(measure_or_reuse(over, out / f"s{seed}-eta{eta}", warmup_s, reuse_dir, "headline"))
            rows.append(row)
    print("\n=== bench headline: evaluating the snapshots (after every run) ===", flush=True)
    for i, row in enumerate(rows, 1):
        accuracies = evaluate_snapshots(scoring, row["snapshots"])
        curve = " ".join(f"{a:.3f}" for a in accuracies)
        print(
            f"bench headline (scored {i}/{len(rows)}): seed {row['seed']}, eta {row['max_staleness']}: {curve}",
            flush=True,
        )
        row["curve"] = [(s["t"], a) for s, a in zip(row["snapshots"], accuracies, strict=True)]
        row["curve_versions"] = [s["version"] for s in row["snapshots"]]
    from asyncrl.config import load_config

    eval_cfg = load_config(None, scoring)
    eval_samples = eval_cfg.task.eval_size * (1 if eval_cfg.eval.greedy else eval_cfg.eval.samples_per_prompt)
    payload = {
        "bench": "headline",
        "workload": workload,
        "overrides": base,
        "seeds": list(seeds),
        "etas": list(etas),
        "target_fraction": target_fraction,
        "warmup_s": warmup_s,
        "snapshot_every_s": snapshot_every_s,
        "time_budget_s": time_budget_s,
        "snapshot_overrides": scoring,
        "eval_samples": eval_samples,
        "sync_setting": sync_setting,
        "sync_probes": probes,
        "rows": rows,
        "lrs": list(lrs),
        "tune_seeds": list(tune_seeds),
        "tuning_from": list(tuning_from),
        "reused_from": reuse,
        "tuning_rows": tuning_rows,
        "tuning": tuning_table,
        "best_lrs": {str(eta): lr for eta, lr in best.items()},
    }
    finished = finish(payload, json_path)
    if json_path:
        progress.unlink(missing_ok=True)  # the result file holds every tuning row
    return finished


def finish(payload: dict[str, Any], json_path: str | None, *, replace: bool = False) -> dict[str, Any]:
    """Analyse the evaluated rows (the pre-registered rule, and beside it the plateau rule as a
    sensitivity check), print the summary, write the JSON and the plot (never over a file:
    ``output.write_with_plot``; ``replace``: ``--reanalyse``, the previous file kept beside)."""
    samples = payload.get("eval_samples", 0)
    plateau = analyse(payload["rows"], payload["target_fraction"], samples, final_window=PLATEAU_WINDOW)
    payload["target_from_sync_plateau"] = {"final_window": PLATEAU_WINDOW, **plateau}
    result = analyse(payload["rows"], payload["target_fraction"], samples)  # last: the rows carry this rule's times
    payload.update(result)
    _print_summary(payload)
    if json_path:
        targets = {s["seed"]: s["target_accuracy"] for s in result["per_seed"]}
        text = json.dumps(payload, indent=2, default=str)
        write_with_plot(json_path, text, lambda png: plot_curves(payload["rows"], png, targets), replace=replace)
    return payload


def reanalyse(json_path: str, *, eval_samples: int | None = None) -> dict[str, Any]:
    """Recompute a finished headline JSON in place (the previous file kept beside it) from its run directories
    (throughput with the current ``measure_throughput`` and ``time_budget``) and its evaluated curves (the
    analysis with the current ``analyse``), without running or evaluating anything again; records that it did."""
    from asyncrl.controller.rundir import read_jsonl

    payload = json.loads(Path(json_path).read_text())
    for row in payload["rows"]:
        run_dir = resolve_run_dir(row["run_dir"], json_path)
        metrics, timeline = read_jsonl(run_dir / "metrics.jsonl"), read_jsonl(run_dir / "timeline.jsonl")
        ledger = read_jsonl(run_dir / "trajectories.jsonl")
        speed = measure_throughput(metrics, ledger, timeline, warmup_s=payload["warmup_s"])
        row.update(speed.as_row())
        row["time_budget"] = time_budget(metrics, timeline)
        row["curve"] = [tuple(point) for point in row["curve"]]
    if eval_samples is not None:
        payload["eval_samples"] = eval_samples
    elif not payload.get("eval_samples"):  # a file from before eval_samples was recorded: its config says
        from asyncrl.config import load_config

        cfg = load_config(None, payload["overrides"])
        payload["eval_samples"] = cfg.task.eval_size * (1 if cfg.eval.greedy else cfg.eval.samples_per_prompt)
    payload.setdefault("reanalysed", []).append(time.strftime("%Y-%m-%d %H:%M:%S"))
    return finish(payload, json_path, replace=True)


def _fmt(stat: dict[str, Any]) -> str:
    if stat.get("mean") is None:
        return "-"
    if stat.get("low") is None:
        return f"{stat['mean']:.3g}"
    return f"{stat['mean']:.3g} [{stat['low']:.3g}, {stat['high']:.3g}]"


def _print_summary(payload: dict[str, Any]) -> None:
    print(f"\nbench headline ({payload['workload']}): synchronous setting {payload['sync_setting']}")
    for s in payload["per_seed"]:
        print(
            f"  seed {s['seed']}: target {s['target_accuracy']:.3f} (sync {s['sync_start']:.3f} -> "
            f"{s['sync_final']:.3f})"
        )
    print(
        f"  {'arm':>6}  {'speed-up (held)':>26}  {'speed-up (first crossing)':>26}  {'final accuracy':>24}  "
        f"{'steady-state ratio':>24}  {'whole-run ratio':>24}"
    )
    for name, stat in payload["summary"].items():
        first = stat.get("speedup_first_crossing", {})  # absent in files analysed before the rule was added
        print(
            f"  {name:>6}  {_fmt(stat['speedup']):>26}  {_fmt(first):>26}  {_fmt(stat['final_accuracy']):>24}  "
            f"{_fmt(stat['steady_state_ratio']):>24}  {_fmt(stat['whole_run_ratio']):>24}"
        )


PLOTTED = True
"""The plot is written beside the result file (its ``.png``)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arms (``--etas``, ``--seeds``, ``--workload``, ``--sync-setting``, ``--probe-steps``), the runs
    (``--set``, ``--model``, ``--steps``, ``--time-budget-s``, ``--out``, ``--reuse``), the measure (``--warmup-s``,
    ``--snapshot-every``, ``--target-fraction``, ``--samples-per-prompt``), ``--reanalyse``, ``--reevaluate``."""
    add_json(parser)
    add_overrides(parser, "model directory of every run (default: the workload's own warm start)")
    add_steps(parser)
    parser.add_argument(
        "--etas",
        help="comma-separated max_staleness values of the asynchronous arms (default 0,2,4,8)",
    )
    add_seeds(parser, "0,1,2")
    parser.add_argument("--workload", default="reason", help=f"one workload (default reason; {', '.join(WORKLOADS)})")
    add_warmup(parser)
    parser.add_argument(
        "--snapshot-every",
        type=float,
        default=20.0,
        help="seconds of RL time between policy snapshots",
    )
    parser.add_argument(
        "--target-fraction",
        type=float,
        default=0.9,
        help="the target is the synchronous run's start + this fraction of its gain (default 0.9)",
    )
    parser.add_argument(
        "--sync-setting",
        help=f"the synchronous setting, without probing ({', '.join(SYNC_CANDIDATES)})",
    )
    parser.add_argument("--probe-steps", type=int, default=0, help="steps of each synchronous probe (0: --steps)")
    parser.add_argument(
        "--time-budget-s",
        type=float,
        default=None,
        help="every arm stops starting steps at this much RL time (--steps stays a cap)",
    )
    parser.add_argument(
        "--samples-per-prompt",
        type=int,
        default=None,
        help="samples per held-out prompt when scoring snapshots (default: the runs' eval setting; --reevaluate: 8)",
    )
    parser.add_argument(
        "--lrs",
        help="comma-separated step sizes: each arm is first tuned over them (final held-out accuracy on "
        "--tune-seeds at the arms' own budget), then runs at its own best",
    )
    parser.add_argument("--tune-seeds", help="comma-separated seeds of the tuning runs (with --lrs; not in --seeds)")
    parser.add_argument(
        "--tuning-from",
        metavar="A,B",
        help="take the tuning rows of earlier invocations (their result files, or the <json stem>.progress.json "
        "an interrupted one left) instead of making those runs again",
    )
    add_out(parser, "runs/bench-headline")
    add_reuse(parser, "runs (tuning runs and arms)")
    add_reanalyse(parser)
    parser.add_argument(
        "--reevaluate",
        metavar="FILE",
        nargs="+",
        help="evaluate the snapshots of finished result files again (--samples-per-prompt), analysed together "
        "into --json (--etas: only those arms)",
    )


def run(args: argparse.Namespace) -> None:
    """``--reanalyse``, ``--reevaluate``, or the options checked and the arms run."""
    if args.samples_per_prompt is not None and args.samples_per_prompt < 1:
        raise ConfigError("--samples-per-prompt must be >= 1")
    if args.reanalyse and args.reevaluate:
        raise ConfigError("--reanalyse and --reevaluate: one at a time")
    if args.reanalyse:
        reanalyse(args.reanalyse)
        return
    etas = parse_list(args.etas, int, (0, 2, 4, 8), "--etas")
    if args.reevaluate:
        from benchmarks.reevaluate import reevaluate

        if not args.json:
            raise ConfigError("--reevaluate needs --json: where the re-evaluated analysis goes")
        samples = args.samples_per_prompt or 8
        reevaluate(args.reevaluate, args.json, samples_per_prompt=samples, etas=etas if args.etas else None)
        return
    base = options.overrides(args)
    if WORKLOAD_ALIASES.get(args.workload, args.workload) not in WORKLOADS:
        raise ConfigError(f"unknown workload {args.workload!r} (available: {', '.join(WORKLOADS)})")
    if args.snapshot_every <= 0:
        raise ConfigError("--snapshot-every must be > 0: the accuracy curves are evaluated from the snapshots")
    if args.sync_setting and args.sync_setting not in SYNC_CANDIDATES:
        raise ConfigError(f"--sync-setting {args.sync_setting!r}: one of {', '.join(SYNC_CANDIDATES)}")
    if args.time_budget_s is not None and args.time_budget_s <= 0:
        raise ConfigError("--time-budget-s must be > 0 (leave it out for step budgets alone)")
    seeds = parse_list(args.seeds, int, (0, 1, 2), "--seeds")
    lrs, tune_seeds, tuning_from = tuning_options(args, base, seeds)
    run_headline_bench(
        args.json,
        overrides=base,
        workload=args.workload,
        steps=args.steps,
        etas=etas,
        seeds=seeds,
        snapshot_every_s=args.snapshot_every,
        warmup_s=args.warmup_s,
        target_fraction=args.target_fraction,
        probe_steps=args.probe_steps,
        sync_setting=args.sync_setting,
        time_budget_s=args.time_budget_s or 0.0,
        snapshot_samples_per_prompt=args.samples_per_prompt,
        out_dir=args.out,
        lrs=lrs,
        tune_seeds=tune_seeds,
        tuning_from=tuning_from,
        reuse=args.reuse,
    )


def tuning_options(
    args: argparse.Namespace, overrides: list[str], seeds: tuple[int, ...]
) -> tuple[tuple[float, ...], tuple[int, ...], list[str]]:
    """``--lrs``, ``--tune-seeds``, ``--tuning-from`` checked: ConfigError (one line) for a step size <= 0, tuning
    without tuning seeds or on a seed the arms are measured on (the choice would flatter that seed), a step size
    also set by ``--set``, or tuning files without ``--lrs``."""
    lrs = parse_list(args.lrs, float, (), "--lrs")
    tune_seeds = parse_list(args.tune_seeds, int, (), "--tune-seeds")
    tuning_from = [p for p in (args.tuning_from or "").split(",") if p]
    if not lrs:
        if tune_seeds or tuning_from:
            raise ConfigError("--tune-seeds and --tuning-from need --lrs: the step sizes to tune over")
        return lrs, tune_seeds, tuning_from
    if min(lrs) <= 0:
        raise ConfigError(f"--lrs must be > 0, got {list(lrs)}")
    if not tune_seeds:
        raise ConfigError("--lrs needs --tune-seeds: the seeds the step sizes are chosen on")
    if shared := sorted(set(tune_seeds) & set(seeds)):
        raise ConfigError(f"--tune-seeds {shared} are also in --seeds: choose step sizes on other seeds")
    if any(o.startswith("trainer.lr=") for o in overrides):
        raise ConfigError("--lrs tunes trainer.lr: leave it out of --set")
    return lrs, tune_seeds, tuning_from
