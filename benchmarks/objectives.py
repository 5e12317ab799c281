"""``python -m benchmarks objectives``: which objective keeps stale samples safe, each at its own best step size.

A two-phase comparison of off-policy objectives, every run a real training run made by the ablation's
machinery (``ablation.arm_overrides`` for the staleness setting and the objective's keys, ``ablation.run_arm``
for the run and its row), so the rows mean exactly what ``python -m benchmarks ablation`` rows mean:

1. **Tuning.** Each objective over the step-size grid (``--lrs``, default 2.5e-5 .. 2e-4) at the tuning lag
   (``--tune-lag``, default 0, controlled), on the tuning seeds; its best step size is the one with the highest
   mean final held-out accuracy (ties: the smaller step). At lag 0 the objectives are one algorithm
   (π_prox = π_behav up to rounding), so a best step size chosen there differs between objectives only by noise;
   ``--tune-lag`` moves the tuning to a lag where they differ. ``--tune-once`` tunes the reference only and gives
   its best step size to every objective; the comparison then runs lag 0 for the reference alone (the tuning
   runs), since the other objectives' runs there would repeat its algorithm.
2. **Comparison.** Each objective at its own best step size and at one shared step size (``--shared-lr``,
   default the config's ``trainer.lr``), under a controlled lag k (``--lags``, ``controller.fixed_lag = k``:
   every sample exactly k versions old) and under ordinary bounded asynchrony η (``--etas``,
   ``controller.max_staleness = η``, the high-water mark off so that the bound, not the mark, limits
   staleness). A run already made (same objective, staleness, lag, step size, seed) is not made again.

Every objective at the same seed trains the same prompts in the same order (``algo.filter_equal_rewards=false``),
so differences are paired by seed: the table ``paired`` gives, per (step-size rule, condition, objective), the
final accuracy minus the reference objective's (``decoupled``, the default) with its 95% t-interval
(``benchmarks.stats.mean_ci95``). Rows carry each run's accuracy before/after and its off-policy statistics
averaged over the run: the raw ``behav_weight_sq_mean`` (E[w²] before the cap) beside the applied one
(``applied_weight_sq_mean``, after the cap: what the gradient sees), ``behav_capped_frac``, ``clip_frac`` and
``applied_clip_frac``, ``approx_kl_behav`` (KL to the behaviour policy), ``staleness_mean``.

The cost is printed before the first run (``estimate_seconds``: per run a fixed part, model load and the held-out
accuracy before and after, plus a per-step part, both measured on the shared 2-core box). ``--short`` is a
few-minute smoke setting of the whole pipeline (two step sizes, lag 2, η 4, 4 steps, 2 seeds, a small eval);
``--plan-only`` prints the plan and its cost and runs nothing.

The whole comparison takes longer than one sitting: after every run the rows so far are kept in
``<json stem>.progress.json`` beside the result file, and ``--rows-from FILE`` (that file, or earlier result
files of runs of the same length and overrides) continues on another day or another machine without making those
runs again.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from asyncrl.config import ConfigError, load_config
from asyncrl.results import write_text_result
from benchmarks import options, tuning
from benchmarks.ablation import OBJECTIVES, StalenessMode, arm_overrides, run_arm
from benchmarks.options import add_json, add_out, add_overrides, add_reuse, add_seeds, add_steps, parse_list
from benchmarks.runs import print_table
from benchmarks.stats import mean_ci95

__all__ = [
    "add_arguments",
    "Cell",
    "best_lrs",
    "comparison",
    "compare_cells",
    "DEFAULTS",
    "estimate_seconds",
    "paired",
    "Plan",
    "progress_path",
    "rows_from",
    "run",
    "run_objectives",
    "SHORT",
    "tune_cells",
    "tuning_table",
]

REFERENCE = "decoupled"
"""The objective every other one is paired with (the project's default objective)."""

BASE_OVERRIDES = ["trainer.ppo_minibatches=4"]
"""Every run's: four PPO mini-batches, so that a clip around π_prox binds from the second update on (with one,
π_θ = π_prox at the only update and every PPO objective is a weighted policy gradient). ``--set`` wins."""

BOUNDED_OVERRIDES = ["controller.high_water_batches=0"]
"""The bounded-asynchrony cells': the high-water mark off, so that η bounds staleness."""

STATS = (
    "behav_weight_sq_mean",
    "applied_weight_sq_mean",
    "applied_weight_max",
    "behav_capped_frac",
    "clip_frac",
    "applied_clip_frac",
    "approx_kl_behav",
    "staleness_mean",
)
"""The off-policy statistics of each row kept in the summaries (means over seeds)."""

SECONDS_PER_RUN = 12.0
SECONDS_PER_STEP = 1.0
"""The cost model of one run on the shared 2-core box (both cores busy: trainer process + engine): a fixed part
(model load, held-out accuracy before and after: wall_s - rl_wall_s) and a per-step part (rl_wall_s / steps),
means of the 144 runs of ``docs/results/bench_ablation_lags.json`` (40 steps, 4 PPO mini-batches, a quiet box)."""

LOADED_COST = (29.6, 3.12)
"""The same on a busy box: one 150-step run (decoupled, lag 4, lr 1e-4, 4 PPO mini-batches) at load 9-10 took
468 s of RL (3.1 s a step: generation and training take turns under a fixed lag) and 29.6 s besides."""


@dataclass(frozen=True)
class Plan:
    """The grid of one invocation."""

    objectives: tuple[str, ...]
    lrs: tuple[float, ...]
    shared_lr: float
    lags: tuple[int, ...]
    etas: tuple[int, ...]
    seeds: tuple[int, ...]
    tune_seeds: tuple[int, ...]
    tune_lag: int
    steps: int
    tune_once: bool = False
    """Tune the reference objective only and give its best step size to every objective (only at lag 0, where the
    objectives are one algorithm: measured, the four default objectives' tuning runs there end identical)."""
    cost: tuple[float, float] = (SECONDS_PER_RUN, SECONDS_PER_STEP)
    """Seconds of one run (a fixed part, a part per step) in the printed estimate: ``SECONDS_PER_*`` by default."""
    loaded_cost: tuple[float, float] | None = LOADED_COST
    """The same on a busy box (printed beside; None: not measured for this plan)."""


DEFAULTS = Plan(
    objectives=("decoupled", "decoupled_uncapped", "prox_clip", "naive"),
    lrs=(2.5e-5, 5e-5, 1e-4, 2e-4),
    shared_lr=1e-4,
    lags=(2, 4, 8),
    etas=(4, 8),
    seeds=(0, 1, 2, 3, 4),
    tune_seeds=(0, 1, 2, 3, 4),
    tune_lag=0,
    steps=150,
)
"""The full comparison (the issue's: >= 4 step sizes from 2.5e-5 to 2e-4, lags 2/4/8, η 4/8, 5 seeds, 150 steps)."""

SHORT = Plan(
    objectives=DEFAULTS.objectives,
    lrs=(5e-5, 2e-4),
    shared_lr=2e-4,
    lags=(2,),
    etas=(4,),
    seeds=(0, 1),
    tune_seeds=(0, 1),
    tune_lag=0,
    steps=4,
    cost=(4.6, 1.5),
    loaded_cost=None,
)
"""``--short``: the whole pipeline in a few minutes (its numbers say nothing about the objectives); its cost model
measured on one such run (10.6 s for 4 steps, the trainer in process)."""

SHORT_OVERRIDES = [
    "task.eval_size=32",
    "eval.samples_per_prompt=1",
    "eval.report_greedy=false",
    "controller.batch_size=8",
    "controller.trainer_process=false",
]
"""``--short``'s smaller runs (before the user's ``--set``)."""


@dataclass(frozen=True)
class Cell:
    """One training run of the grid: an objective at a step size under a staleness setting, one seed."""

    objective: str
    staleness: StalenessMode
    lag: int
    lr: float
    seed: int

    @property
    def name(self) -> str:
        """Its run directory's name."""
        return f"{self.staleness}-lag{self.lag}-lr{self.lr:g}-s{self.seed}-{self.objective}"


def _tuned(plan: Plan) -> tuple[str, ...]:
    return (REFERENCE,) if plan.tune_once else plan.objectives


def tune_cells(plan: Plan) -> list[Cell]:
    """The tuning phase: every objective (``tune_once``: the reference) at every step size at the tuning lag,
    seed-major."""
    return [Cell(o, "fixed", plan.tune_lag, lr, s) for s in plan.tune_seeds for lr in plan.lrs for o in _tuned(plan)]


def _conditions(plan: Plan) -> list[tuple[StalenessMode, int]]:
    """The conditions compared: the tuning lag first (the baseline), then the controlled lags, then the bounds η."""
    fixed = [("fixed", k) for k in (plan.tune_lag, *plan.lags)]
    return list(dict.fromkeys([*fixed, *(("bounded", eta) for eta in plan.etas)]))


def _same_as_reference(plan: Plan, objective: str, staleness: StalenessMode, lag: int) -> bool:
    """With ``tune_once`` at controlled lag 0 every objective is the reference's algorithm there (π_prox = π_behav
    up to rounding), so only the reference runs that condition: the others' runs would repeat it at the cost of a
    fifth of the comparison."""
    return plan.tune_once and objective != REFERENCE and (staleness, lag) == ("fixed", plan.tune_lag)


def compare_cells(plan: Plan, best: dict[str, float], done: set[Cell] | None = None) -> list[Cell]:
    """The comparison phase: each objective at its best step size and at the shared one (one run where they are
    equal), under every condition, the tuning lag included (its tuning runs, passed in ``done``, are not made
    again: what remains there is a shared step size off the grid and seeds beyond the tuning seeds); seed-major."""
    out: list[Cell] = []
    for seed in plan.seeds:
        for staleness, lag in _conditions(plan):
            for objective in plan.objectives:
                if _same_as_reference(plan, objective, staleness, lag):
                    continue
                for lr in dict.fromkeys([best[objective], plan.shared_lr]):
                    cell = Cell(objective, staleness, lag, lr, seed)
                    if cell not in (done or set()) and cell not in out:
                        out.append(cell)
    return out


def estimate_seconds(n_runs: int, steps: int, cost: tuple[float, float] = Plan.cost) -> float:
    """Wall seconds of ``n_runs`` runs of ``steps`` steps each, one after the other (``cost``: seconds per run, per
    step; by default ``SECONDS_PER_*``)."""
    return n_runs * (cost[0] + steps * cost[1])


def budget_line(plan: Plan) -> str:
    """The plan's size and cost, before any run: the comparison's count is an upper bound (every objective's best
    step size different from the shared one)."""
    n_tune = len(tune_cells(plan))
    other = next((lr for lr in plan.lrs if lr != plan.shared_lr), plan.shared_lr)
    worst = dict.fromkeys(plan.objectives, other)  # every best off the shared step size: the most runs
    n_compare = len(compare_cells(plan, worst, set(tune_cells(plan))))
    hours = estimate_seconds(n_tune + n_compare, plan.steps, plan.cost) / 3600
    line = (
        f"bench objectives: {n_tune} tuning runs + at most {n_compare} comparison runs of {plan.steps} steps, about "
        f"{hours:.1f} h ({60 * hours:.0f} min) of wall time on a quiet 2-core box, one run after the other "
        f"({2 * hours:.1f} core-hours; "
        f"{plan.cost[0]:g} s + {plan.cost[1]:g} s/step per run)"
    )
    if plan.loaded_cost is None:
        return line
    busy = estimate_seconds(n_tune + n_compare, plan.steps, plan.loaded_cost) / 3600
    return f"{line}; on a busy box (load ~9) about {busy:.1f} h ({plan.loaded_cost[1]:g} s/step)"


def tuning_table(rows: list[dict[str, Any]], plan: Plan) -> list[dict[str, Any]]:
    """Per (objective, step size) at the tuning lag: final accuracy over the tuning seeds (mean, 95% interval)."""

    def at_tuning_lag(row: dict[str, Any]) -> bool:
        return (row["staleness"], row["lag"]) == ("fixed", plan.tune_lag)

    return tuning.tuning_table(rows, "objective", _tuned(plan), plan.lrs, plan.tune_seeds, at_tuning_lag)


def best_lrs(table: list[dict[str, Any]]) -> dict[str, float]:
    """Each objective's step size of highest mean final accuracy in ``tuning_table`` (ties: the smaller)."""
    return tuning.best_lrs(table, "objective")


def _lr_of(rule: str, objective: str, best: dict[str, float], plan: Plan) -> float:
    return best[objective] if rule == "own" else plan.shared_lr


def comparison(rows: list[dict[str, Any]], plan: Plan, best: dict[str, float]) -> list[dict[str, Any]]:
    """Per (step-size rule, condition, objective), the tuning lag included: final accuracy over the seeds (mean,
    95% interval) and the means of ``STATS``."""
    index = {(r["objective"], r["staleness"], r["lag"], r["lr"], r["seed"]): r for r in rows}
    out = []
    for rule in ("own", "shared"):
        for staleness, lag in _conditions(plan):
            for objective in plan.objectives:
                lr = _lr_of(rule, objective, best, plan)
                cell = [index[k] for s in plan.seeds if (k := (objective, staleness, lag, lr, s)) in index]
                ci = mean_ci95([r["accuracy_after"] for r in cell if r["accuracy_after"] is not None])
                item: dict[str, Any] = {
                    "lr_rule": rule,
                    "staleness": staleness,
                    "lag": lag,
                    "objective": objective,
                    "lr": lr,
                    "n": ci["n"],
                    "accuracy_after_mean": ci["mean"],
                    "accuracy_after_ci95": [ci["low"], ci["high"]],
                    "accuracy_before_mean": statistics.fmean([r["accuracy_before"] for r in cell]) if cell else None,
                    "collapse_rate": sum(r["collapsed"] for r in cell) / len(cell) if cell else None,
                }
                for stat in STATS:
                    values = [r[stat] for r in cell if isinstance(r.get(stat), int | float)]
                    item[stat] = statistics.fmean(values) if values else None
                out.append(item)
    return out


def paired(rows: list[dict[str, Any]], plan: Plan, best: dict[str, float]) -> list[dict[str, Any]]:
    """Per (step-size rule, condition, objective != reference): final accuracy minus the reference objective's at
    the same seed (each at the rule's step size), with the mean and 95% t-interval over the seeds both ran."""
    index = {(r["objective"], r["staleness"], r["lag"], r["lr"], r["seed"]): r["accuracy_after"] for r in rows}
    out = []
    for rule in ("own", "shared"):
        for staleness, lag in _conditions(plan):
            ref_lr = _lr_of(rule, REFERENCE, best, plan)
            for objective in plan.objectives:
                if objective == REFERENCE:
                    continue
                lr = _lr_of(rule, objective, best, plan)
                diffs = [
                    a - b
                    for s in plan.seeds
                    if (a := index.get((objective, staleness, lag, lr, s))) is not None
                    and (b := index.get((REFERENCE, staleness, lag, ref_lr, s))) is not None
                ]
                if not diffs:
                    continue
                ci = mean_ci95(diffs)
                out.append(
                    {
                        "lr_rule": rule,
                        "staleness": staleness,
                        "lag": lag,
                        "objective": objective,
                        "reference": REFERENCE,
                        "lr": lr,
                        "reference_lr": ref_lr,
                        "n": ci["n"],
                        "minus_reference_mean": ci["mean"],
                        "minus_reference_ci95": [ci["low"], ci["high"]],
                        "minus_reference_per_seed": diffs,
                        "excludes_zero": ci["low"] is not None and (ci["low"] > 0 or ci["high"] < 0),
                    }
                )
    return out


def _row(cell: Cell, phase: str, run: dict[str, Any]) -> dict[str, Any]:
    """A run's row: the cell, its phase, and the ablation row (its per-step curves cut to reward and KL)."""
    curves = run.pop("curves", {})
    keep = {k: curves[k] for k in ("reward", "approx_kl_behav") if k in curves}
    return {**asdict(cell), "phase": phase, **run, "curves": keep}


def _run_cells(
    cells: list[Cell],
    phase: str,
    user: list[str],
    plan: Plan,
    out: Path,
    reuse: Path | None,
    done: dict[Cell, dict[str, Any]],
    record: Callable[[dict[str, Any]], None],
    missing: list[Cell] | None = None,
) -> list[dict]:
    """Each cell's row: from ``done`` (``--rows-from``) where it holds the cell, else from a run (``record``ed as
    soon as it is made); with ``missing`` (``--tables-only``) a cell without a row is added there and not run."""
    rows = []
    for i, cell in enumerate(cells, 1):
        if cell in done:
            print(f"bench objectives ({phase} {i}/{len(cells)}): {cell.name} from --rows-from", flush=True)
            rows.append({**done[cell], "from_rows_file": True})
            continue
        if missing is not None:
            missing.append(cell)
            continue
        print(f"\n=== bench objectives ({phase} {i}/{len(cells)}): {cell.name} ===", flush=True)
        extra = BOUNDED_OVERRIDES if cell.staleness == "bounded" else []
        base = [*BASE_OVERRIDES, *extra, *user]
        arm = arm_overrides(cell.objective, cell.lag, cell.lr, cell.seed, plan.steps, base, cell.staleness)
        rows.append(_row(cell, phase, run_arm(arm, out / cell.name, 0.5, reuse)))
        record(rows[-1])
    return rows


PLAN_KEYS_OF_ROWS = ("steps",)
"""What a rows file's plan must share with this invocation's for its rows to be taken. A row is keyed by its whole
cell (objective, staleness, lag, step size, seed), so with the same run length and overrides a row means the same
run whatever else the plans hold: seeds, step sizes, lags and objectives may be added in a later sitting."""

ROW_CELL_KEYS = ("objective", "staleness", "lag", "lr", "seed")


def rows_from(paths: list[str], plan: Plan, overrides: list[str]) -> dict[Cell, dict[str, Any]]:
    """The rows of earlier invocations (``--rows-from``: their result files or progress files), keyed by their
    cell, leaving out rows of runs stopped before their last evaluation (no final accuracy: made again);
    ConfigError (one line) for a file that is missing, unreadable or not this bench's, or whose runs had another
    length or other overrides."""
    done: dict[Cell, dict[str, Any]] = {}
    ours = asdict(plan)
    for path in paths:
        try:
            payload = json.loads(Path(path).read_text())
            if payload.get("bench") != "objectives":
                raise ValueError(f"its bench is {payload.get('bench')!r}")
            theirs, rows = dict(payload["plan"]), list(payload["rows"])
            cells = [Cell(*(row[k] for k in ROW_CELL_KEYS)) for row in rows]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"--rows-from {path}: not an objectives result or progress file ({exc!r})") from exc
        differ = [k for k in PLAN_KEYS_OF_ROWS if _plain(theirs.get(k)) != _plain(ours[k])]
        if differ:
            key = differ[0]
            raise ConfigError(
                f"--rows-from {path}: its plan has {key}={theirs.get(key)!r} where this one has {ours[key]!r}; rows "
                "are taken only from runs of the same length"
            )
        if payload.get("overrides") != overrides or payload.get("bounded_overrides", BOUNDED_OVERRIDES) != list(
            BOUNDED_OVERRIDES
        ):
            raise ConfigError(
                f"--rows-from {path}: its runs were made with {payload.get('overrides')} where this invocation's are "
                f"{overrides}"
            )
        finished = [(c, r) for c, r in zip(cells, rows, strict=True) if r.get("accuracy_after") is not None]
        if len(finished) < len(rows):  # a run stopped before its last evaluation: made again
            print(f"bench objectives: {len(rows) - len(finished)} unfinished row(s) of {path} will be made again")
        done.update(finished)
    return done


def _plain(value: Any) -> Any:
    """A plan value as JSON gives it back (tuples as lists)."""
    return list(value) if isinstance(value, tuple) else value


def progress_path(json_path: str | None, out: Path) -> Path:
    """Where the rows so far are kept after every run: beside the result file (``<stem>.progress.json``), else
    in the invocation's run directory; ``--rows-from`` continues from it."""
    return tuning.progress_path(json_path, out, "objectives")


def check_progress_file(json_path: str | None, rows_files: list[str]) -> None:
    """ConfigError (one line) when the result file's progress file holds an earlier invocation's rows that this
    one does not continue from: its first run would replace them."""
    if json_path:
        tuning.refuse_unnamed_progress(progress_path(json_path, Path(".")), rows_files, "--rows-from")


def run_objectives(
    json_path: str | None,
    plan: Plan,
    *,
    overrides: list[str] | None = None,
    out_dir: str = "runs/bench-objectives",
    reuse: str | None = None,
    rows_files: list[str] | None = None,
    plan_only: bool = False,
    tables_only: bool = False,
) -> dict[str, Any]:
    """The two phases (module docstring): prints the budget first, then runs the tuning grid, picks each
    objective's best step size, runs the comparison, prints the tables and, with ``json_path``, writes
    ``{"bench": "objectives", "plan", "rows", "tuning", "best_lrs", "comparison", "paired", ...}``. After every run
    the rows so far are kept in ``progress_path``; ``rows_files`` (earlier invocations' result or progress files
    of runs of the same length and overrides) give rows that are not made again. ``tables_only``: no run is made;
    the tables are those of the ``rows_files`` rows, and the cells without one are listed (``missing_cells``)."""
    from asyncrl.controller.run_claim import fresh_subdir

    user = list(overrides or [])
    _check_arms(plan, user)
    print(budget_line(plan), flush=True)
    if plan_only:
        return {"plan": asdict(plan)}
    overrides_used = [*BASE_OVERRIDES, *user]
    done = rows_from(list(rows_files or []), plan, overrides_used)
    check_progress_file(json_path, list(rows_files or []))
    out = Path(out_dir) if tables_only else fresh_subdir(out_dir)
    if not tables_only:
        print(f"bench objectives: run directories under {out}", flush=True)
    prior = Path(reuse) if reuse else None
    progress = progress_path(json_path, out)
    made: list[dict[str, Any]] = [*done.values()]

    def record(row: dict[str, Any]) -> None:
        made.append(row)
        kept = {"bench": "objectives", "plan": asdict(plan), "overrides": overrides_used, "rows": made}
        tuning.write_progress(progress, {**kept, "bounded_overrides": BOUNDED_OVERRIDES})

    if done:
        print(f"bench objectives: {len(done)} rows from --rows-from; new rows kept in {progress}", flush=True)
    tuned = tune_cells(plan)
    missing: list[Cell] | None = [] if tables_only else None
    rows = _run_cells(tuned, "tune", user, plan, out, prior, done, record, missing)
    table = tuning_table(rows, plan)
    best = _choose_lrs(table, plan)
    compared = compare_cells(plan, best, set(tuned))
    rows += _run_cells(compared, "compare", user, plan, out, prior, done, record, missing)
    payload = {
        "bench": "objectives",
        "plan": asdict(plan),
        "overrides": overrides_used,
        "bounded_overrides": BOUNDED_OVERRIDES,
        "objectives": {o: OBJECTIVES[o] for o in plan.objectives},
        "reference": REFERENCE,
        "rows": rows,
        "tuning": table,
        "best_lrs": best,
        "out_dir": str(out),
        "reused_from": reuse,
        "rows_from": list(rows_files or []),
        "estimate": budget_line(plan),
        "wall_s_total": sum(r["wall_s"] for r in rows if not r.get("from_rows_file")),
        "rows_unused": [row for cell, row in done.items() if cell not in set(tuned) | set(compared)],
    }
    if missing is not None:
        payload["missing_cells"] = [asdict(cell) for cell in missing]
        print(f"bench objectives: --tables-only, {len(missing)} of {len(tuned) + len(compared)} cells without a row")
    finished = _finish(payload, plan, best, json_path)
    if json_path and not tables_only:  # with --tables-only a later sitting continues from it
        progress.unlink(missing_ok=True)  # the result file holds every row (those of other cells in rows_unused)
    return finished


def _check_arms(plan: Plan, user: list[str]) -> None:
    """Every objective's keys checked at both staleness settings, before any run (a ConfigError in one line)."""
    for objective in plan.objectives:
        for staleness, lag in (("fixed", max(plan.lags, default=0)), ("bounded", max(plan.etas, default=0))):
            arm = arm_overrides(
                objective, lag, plan.lrs[0], plan.seeds[0], plan.steps, [*BASE_OVERRIDES, *user], staleness
            )
            load_config(None, arm)


def _choose_lrs(table: list[dict[str, Any]], plan: Plan) -> dict[str, float]:
    """Each objective's best step size (``tune_once``: the reference's for all), printed with the tuning table; a
    ConfigError when a tuned objective has no finished run (``--tables-only`` before the tuning is done)."""
    try:
        best = best_lrs(table)
    except ValueError as exc:
        raise ConfigError(f"bench objectives: {exc}: the comparison needs every tuned step size") from exc
    if plan.tune_once:
        best = dict.fromkeys(plan.objectives, best[REFERENCE])
    print_table(
        "bench objectives: tuning (final accuracy over the tuning seeds)",
        _shown(table),
        ["objective", "lr", "n", "accuracy_after_mean", "accuracy_after_ci95"],
        width=18,
        digits=4,
    )
    print(f"bench objectives: best step sizes {best}; shared {plan.shared_lr:g}", flush=True)
    return best


RUN_KEYS = [
    "objective",
    "staleness",
    "lag",
    "lr",
    "seed",
    "accuracy_before",
    "accuracy_after",
    "applied_weight_sq_mean",
    "behav_weight_sq_mean",
    "approx_kl_behav",
]
SUMMARY_KEYS = [
    "lr_rule",
    "staleness",
    "lag",
    "objective",
    "lr",
    "n",
    "accuracy_after_mean",
    "applied_weight_sq_mean",
    "applied_clip_frac",
    "behav_capped_frac",
    "approx_kl_behav",
]
PAIRED_KEYS = ["lr_rule", "staleness", "lag", "objective", "lr", "n", "minus_reference_mean", "minus_reference_ci95"]
"""The columns of the printed tables (the JSON holds every key)."""


def _shown(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows as printed: step sizes in ``g`` format (a fixed number of decimals would show 5e-05 as 0.0001)
    and intervals to three decimals."""
    out = []
    for row in rows:
        shown = {**row}
        for key in ("lr", "reference_lr"):
            if isinstance(row.get(key), float):
                shown[key] = f"{row[key]:g}"
        for key in ("accuracy_after_ci95", "minus_reference_ci95"):
            if isinstance(row.get(key), list):
                shown[key] = "[" + ", ".join("-" if v is None else f"{v:.3f}" for v in row[key]) + "]"
        out.append(shown)
    return out


def _finish(payload: dict[str, Any], plan: Plan, best: dict[str, float], json_path: str | None) -> dict[str, Any]:
    rows = payload["rows"]
    payload["comparison"] = comparison(rows, plan, best)
    payload["paired"] = paired(rows, plan, best)
    print_table("bench objectives: runs", _shown(rows), RUN_KEYS, width=14, digits=4)
    title = "bench objectives: over seeds (95% t-interval)"
    print_table(title, _shown(payload["comparison"]), SUMMARY_KEYS, width=14, digits=4)
    title = f"bench objectives: minus {REFERENCE}, paired by seed"
    print_table(title, _shown(payload["paired"]), PAIRED_KEYS, width=14, digits=4)
    if json_path:
        print(f"\nwrote {write_text_result(json_path, json.dumps(payload, indent=2))}", flush=True)
    return payload


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The grid (``--objectives``, ``--lrs``, ``--shared-lr``, ``--lags``, ``--etas``, ``--seeds``,
    ``--tune-seeds``, ``--tune-lag``, ``--steps``), ``--short``, ``--plan-only``, and the runs (``--set``,
    ``--model``, ``--out``, ``--reuse``, ``--rows-from``)."""
    d = DEFAULTS
    add_json(parser)
    add_overrides(parser)
    add_steps(parser, f"training steps per run (default {d.steps})")
    parser.add_argument(
        "--objectives", help=f"comma-separated (default {','.join(d.objectives)}; available: {', '.join(OBJECTIVES)})"
    )
    parser.add_argument("--lrs", help=f"comma-separated step sizes to tune over (default {','.join(map(str, d.lrs))})")
    parser.add_argument(
        "--shared-lr", type=float, help="the step size every objective also runs at (default: the config's trainer.lr)"
    )
    parser.add_argument("--lags", help=f"comma-separated controlled lags (default {','.join(map(str, d.lags))})")
    parser.add_argument(
        "--etas",
        help=f"comma-separated bounds η of bounded asynchrony (default {','.join(map(str, d.etas))}; empty: none)",
    )
    add_seeds(parser, ",".join(map(str, d.seeds)))
    parser.add_argument("--tune-seeds", help="comma-separated seeds of the tuning phase (default: --seeds)")
    parser.add_argument("--tune-lag", type=int, help=f"controlled lag of the tuning phase (default {d.tune_lag})")
    parser.add_argument(
        "--short",
        action="store_true",
        help="a few-minute smoke setting of the whole pipeline "
        "(2 step sizes, lag 2, eta 4, 4 steps, 2 seeds, a small eval); other options still "
        "apply",
    )
    parser.add_argument(
        "--tune-once",
        action="store_true",
        help="tune decoupled only and give its best step size "
        "to every objective (with --tune-lag 0, where the objectives are one algorithm)",
    )
    parser.add_argument("--plan-only", action="store_true", help="print the plan and its cost, run nothing")
    parser.add_argument(
        "--tables-only",
        action="store_true",
        help="the tables of the --rows-from rows, running nothing (the cells without a row are listed)",
    )
    add_out(parser, "runs/bench-objectives")
    add_reuse(parser, "runs")
    parser.add_argument(
        "--rows-from",
        metavar="A,B",
        help="take the rows of earlier invocations with the same --steps and --set (their result files, or the "
        "<json stem>.progress.json an interrupted one left) instead of making those runs again",
    )


def plan_from_args(args: argparse.Namespace, config_lr: float) -> Plan:
    """The ``Plan`` of the options (``--short``'s defaults, then each option given)."""
    base = SHORT if args.short else DEFAULTS
    objectives = tuple(args.objectives.split(",")) if args.objectives else base.objectives
    unknown = [o for o in objectives if o not in OBJECTIVES]
    if unknown:
        raise ConfigError(f"unknown objective(s) {unknown} (available: {', '.join(OBJECTIVES)})")
    if REFERENCE not in objectives:
        raise ConfigError(f"--objectives must include {REFERENCE} (the reference of the paired differences)")
    seeds = parse_list(args.seeds, int, base.seeds, "--seeds")
    etas = () if args.etas == "" else parse_list(args.etas, int, base.etas, "--etas")
    shared = args.shared_lr if args.shared_lr is not None else (base.shared_lr if args.short else config_lr)
    plan = Plan(
        objectives=objectives,
        lrs=parse_list(args.lrs, float, base.lrs, "--lrs"),
        shared_lr=shared,
        lags=parse_list(args.lags, int, base.lags, "--lags"),
        etas=etas,
        seeds=seeds,
        tune_seeds=parse_list(args.tune_seeds, int, seeds, "--tune-seeds"),
        tune_lag=base.tune_lag if args.tune_lag is None else args.tune_lag,
        steps=args.steps if args.steps is not None else base.steps,
        tune_once=args.tune_once,
        cost=base.cost,
        loaded_cost=base.loaded_cost,
    )
    if plan.tune_once and plan.tune_lag != 0:
        raise ConfigError(
            f"--tune-once needs --tune-lag 0 (only there are the objectives one algorithm), got {plan.tune_lag}"
        )
    if not plan.lrs or min(plan.lrs) <= 0 or plan.shared_lr <= 0:
        raise ConfigError("--lrs and --shared-lr must be > 0")
    if min((*plan.lags, *plan.etas, plan.tune_lag)) < 0 or plan.steps < 1:
        raise ConfigError("--lags, --etas and --tune-lag must be >= 0, --steps >= 1")
    return plan


def run(args: argparse.Namespace) -> None:
    """The options checked (every step size a valid ``trainer.lr``), then the plan's cost, then every run."""
    if args.tables_only and not args.rows_from:
        raise ConfigError("--tables-only needs --rows-from: the rows to make the tables of")
    user = [*(SHORT_OVERRIDES if args.short else []), *options.overrides(args)]
    plan = plan_from_args(args, load_config(None, user).trainer.lr)
    for lr in (*plan.lrs, plan.shared_lr):
        load_config(None, [*user, f"trainer.lr={lr!r}"])
    run_objectives(
        args.json,
        plan,
        overrides=user,
        out_dir=args.out,
        reuse=args.reuse,
        rows_files=args.rows_from.split(",") if args.rows_from else None,
        plan_only=args.plan_only,
        tables_only=args.tables_only,
    )
