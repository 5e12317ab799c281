"""``asyncrl bench NAME``: the dispatch of the benchmarks, split off ``cli.py`` (module size).

Owns ``cmd_bench`` (one ``match`` over the benchmark names) and the argument handling of the benches
whose options need checking before a run starts (ablation, headline), the result file of every bench
included: one that exists, or cannot be written, is refused before any work (``asyncrl.results``). The
bench sub-parser itself is declared in ``cli.build_parser`` with the other sub-commands. Heavy imports
happen inside each case, so ``asyncrl --help`` stays instant.
"""

from __future__ import annotations

import argparse
import math

from asyncrl.config import ConfigError, load_config
from asyncrl.results import check_result_path

__all__ = ["BENCHMARKS", "cmd_bench"]

BENCHMARKS = (
    "engine", "decode", "train", "async", "interrupt", "ablation", "headline", "profile", "sim-validate",
    "prefix-reuse", "agent-learning", "agent-throughput", "adaptive", "plan-check", "paper-curves",
    "paper-curves-fitted",
)  # fmt: skip
"""The names ``cmd_bench`` dispatches (its ``match``), for the parser's help and the unknown-name error."""

PLOTTED = ("ablation", "agent-learning", "agent-throughput", "headline", "paper-curves", "paper-curves-fitted")
"""The benches that write a plot beside their result file (its ``.png``)."""

REANALYSED = ("ablation", "headline", "agent-throughput")
"""The benches whose ``--reanalyse FILE`` recomputes FILE (the previous one kept beside it) and runs nothing."""


def cmd_bench(args: argparse.Namespace) -> int:
    if args.name in BENCHMARKS:
        _check_finite_flags(args)
        _check_result_file(args)
    match args.name:
        case "engine":
            from asyncrl.bench.engine import run_engine_bench

            run_engine_bench(args.json, model_dir=args.model)
        case "decode":
            from asyncrl.bench.decode import run_decode_sweep

            sizes = {}
            try:
                if args.contexts:
                    sizes["contexts"] = tuple(int(x) for x in args.contexts.split(","))
                if args.running:
                    sizes["running"] = tuple(int(x) for x in args.running.split(","))
                run_decode_sweep(args.json, model_dir=args.model, **sizes)
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
        case "train":
            from asyncrl.bench.train import run_train_bench

            run_train_bench(args.json)
        case "ablation":
            _bench_ablation(args)
        case "async" | "interrupt":
            from asyncrl.bench import async_bench

            overrides = _bench_overrides(args)
            common = dict(overrides=overrides, steps=args.steps)
            if args.out:
                common["out_dir"] = args.out
            if args.name == "async":
                etas = tuple(int(x) for x in args.etas.split(",")) if args.etas else (0, 1, 2, 4, 8)
                workloads = tuple(args.workload.split(",")) if args.workload else ("task", "long")
                unknown = set(workloads) - set(async_bench.WORKLOADS) - set(async_bench.WORKLOAD_ALIASES)
                if unknown:
                    available = ", ".join(async_bench.WORKLOADS)
                    raise ConfigError(f"unknown workload(s) {sorted(unknown)} (available: {available})")
                seeds = tuple(int(x) for x in args.seeds.split(",")) if args.seeds else (0,)
                marks = tuple(int(x) for x in args.high_water.split(",")) if args.high_water else None
                async_bench.run_async_bench(
                    args.json, etas=etas, workloads=workloads, seeds=seeds, warmup_s=_warmup(args),
                    high_waters=marks, calibrate_s=args.calibrate, **common,
                )  # fmt: skip
            else:
                async_bench.run_interrupt_bench(args.json, **common)
        case "headline":
            _bench_headline(args)
        case "prefix-reuse":  # prefill tokens per multi-turn episode, rollout.prefix_reuse off and on
            from asyncrl.bench.prefix_reuse import run_prefix_reuse_bench

            seeds = tuple(int(x) for x in args.seeds.split(",")) if args.seeds else (0, 1, 2)
            workload = args.workload or "calculator"
            run_prefix_reuse_bench(args.json, overrides=_bench_overrides(args), seeds=seeds, workload=workload)
        case "adaptive":  # controller.adaptive against fixed max_staleness, real or simulated (--profile)
            _bench_adaptive(args)
        case "agent-learning":  # warm start + RL on calculator within a wall budget, per seed
            _bench_agent_learning(args)
        case "agent-throughput":  # calculator with slow tools: eta=4 against the best synchronous setting
            _bench_agent_throughput(args)
        case "profile":  # this machine's cost profile for asyncrl simulate
            from asyncrl.sim.command import bench_profile

            bench_profile(args.json, args.from_runs)
        case "sim-validate":  # the simulator against measured runs
            from asyncrl.sim.command import bench_sim_validate

            bench_sim_validate(args.json, args.runs, args.from_runs, args.profile, args.seeds)
        case "plan-check":  # asyncrl plan's recommendation run for real beside a sweep of alternatives
            _bench_plan_check(args)
        case "paper-curves" | "paper-curves-fitted":  # AReaL's published curves against the simulator's
            from asyncrl.sim.paper_report import bench_paper_curves

            bench_paper_curves(args.json, args.steps, fit_lengths=args.name == "paper-curves-fitted")
        case other:
            raise ConfigError(f"unknown benchmark {other!r} (available: {', '.join(BENCHMARKS)})")
    return 0


def _bench_plan_check(args: argparse.Namespace) -> None:
    """``asyncrl bench plan-check --plan PLAN.json``: real runs of a plan's settings (``bench/plan_check.py``)."""
    from asyncrl.bench.plan_check import PlanCheckError, run_plan_check

    if not args.plan:
        raise ConfigError("bench plan-check needs --plan PLAN.json (written by asyncrl plan --json)")
    try:
        seeds = tuple(int(x) for x in args.seeds.split(",")) if args.seeds else (0, 1)
    except ValueError as exc:
        raise ConfigError(f"bench plan-check: --seeds takes integers: {exc}") from exc
    try:
        run_plan_check(
            args.json, args.plan, overrides=_bench_overrides(args), seeds=seeds, steps=args.steps,
            warmup_s=_warmup(args), max_settings=args.max_settings, **({"out_dir": args.out} if args.out else {}),
        )  # fmt: skip
    except PlanCheckError as exc:
        raise ConfigError(f"bench plan-check: {exc}") from exc


def _bench_agent_learning(args: argparse.Namespace) -> None:
    """``asyncrl bench agent-learning``: warm start + RL on calculator per seed (``bench/agent_learning.py``)."""
    from asyncrl.bench.agent_learning import run_agent_learning_bench

    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [0, 1, 2]
    run_agent_learning_bench(
        args.json, config=args.config or "configs/calculator.yaml", overrides=_bench_overrides(args),
        seeds=seeds, budget_s=args.budget_s, out_dir=args.out or "runs/bench-agent-learning",
    )  # fmt: skip


def _bench_agent_throughput(args: argparse.Namespace) -> None:
    """``asyncrl bench agent-throughput``: trained tokens/s with slow tools, η = 4 against the best synchronous
    setting, per seed (``bench/agent_throughput.py``)."""
    from asyncrl.bench import agent_throughput, headline

    if args.reanalyse:
        agent_throughput.reanalyse(args.reanalyse)
        return
    try:
        seeds = tuple(int(x) for x in args.seeds.split(",")) if args.seeds else (0, 1, 2)
    except ValueError as exc:
        raise ConfigError(f"bench agent-throughput: --seeds takes integers: {exc}") from exc
    if args.sync_setting and args.sync_setting not in headline.SYNC_CANDIDATES:
        raise ConfigError(f"--sync-setting {args.sync_setting!r}: one of {', '.join(headline.SYNC_CANDIDATES)}")
    overrides = _bench_overrides(args)
    load_config(None, [*agent_throughput.WORKLOAD, *overrides])  # fail fast on an override the workload refuses
    agent_throughput.run_agent_throughput_bench(
        args.json, overrides=overrides, seeds=seeds, steps=args.steps or 40,
        warmup_s=_warmup(args, 20.0), probe_steps=args.probe_steps,
        sync_setting=args.sync_setting, out_dir=args.out or "runs/bench-agent-throughput",
    )  # fmt: skip


def _bench_adaptive(args: argparse.Namespace) -> None:
    """``asyncrl bench adaptive``: its options checked, then real runs or, with ``--profile``,
    simulated ones (``bench/adaptive.py``, ``sim/compare.py``)."""
    from asyncrl.bench import adaptive, async_bench

    try:
        etas = tuple(int(x) for x in args.etas.split(",")) if args.etas else (0, 2, 4, 8)
        seeds = tuple(int(x) for x in args.seeds.split(",")) if args.seeds else (0, 1, 2)
        adaptive.arms(etas)
    except ValueError as exc:
        raise ConfigError(f"bench adaptive: {exc}") from exc
    workloads = tuple(async_bench.WORKLOAD_ALIASES.get(w, w) for w in (args.workload or "task,long").split(","))
    out_dir = args.out or "runs/bench-adaptive"
    common = dict(etas=etas, seeds=seeds, steps=args.steps, warmup_s=_warmup(args), out_dir=out_dir)
    if not args.profile:
        unknown = sorted(set(workloads) - set(async_bench.WORKLOADS))
        if unknown:
            raise ConfigError(f"bench adaptive: unknown workload(s) {unknown} (available: task, long, reason)")
        adaptive.run_adaptive_bench(args.json, workloads=workloads, overrides=_bench_overrides(args), reuse=args.reuse,
                                    **common)  # fmt: skip
        return
    from asyncrl.sim.compare import SIM_WORKLOADS, simulated_runner

    if set(workloads) - set(SIM_WORKLOADS):
        raise ConfigError(f"bench adaptive: unknown workload(s) {sorted(set(workloads) - set(SIM_WORKLOADS))} "
                          f"(simulated: {', '.join(SIM_WORKLOADS)})")  # fmt: skip
    profiles = tuple(args.profile.split(","))
    keys = tuple(f"{p}/{w}" for p in profiles for w in workloads)
    adaptive.run_adaptive_bench(
        args.json, workloads=keys, run_one=simulated_runner(args.steps or 100), mode="simulated", profiles=profiles,
        **common,
    )  # fmt: skip


def _check_finite_flags(args: argparse.Namespace) -> None:
    """Every number option (``--warmup-s``, ``--snapshot-every``, ...) finite: argparse reads ``nan``."""
    for name, value in vars(args).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"--{name.replace('_', '-')} must be a finite number, got {value}")


def _check_result_file(args: argparse.Namespace) -> None:
    """Before any work: the result file this invocation writes (``--json``; paper-curves: its default under
    docs/results) and the plot beside it must not exist yet, in a folder this user can write; a bench never
    replaces a result (``asyncrl.results``). ``--reanalyse FILE`` is exempt: it asks for FILE to be recomputed."""
    if getattr(args, "reanalyse", None) and args.name in REANALYSED:
        return
    target = args.json
    if target is None and args.name in ("paper-curves", "paper-curves-fitted"):
        from asyncrl.sim.paper_report import DEFAULT_JSON, FITTED_JSON

        target = FITTED_JSON if args.name == "paper-curves-fitted" else DEFAULT_JSON
    if target:
        check_result_path(target, beside=(".png",) if args.name in PLOTTED else ())


def _warmup(args: argparse.Namespace, default: float = 60.0) -> float:
    """``--warmup-s``, or the bench's default (60 s; agent-throughput: 20 s)."""
    return default if args.warmup_s is None else float(args.warmup_s)


def _bench_overrides(args: argparse.Namespace) -> list[str]:
    """The config overrides of every run of a bench (``--set``, then ``--model``), checked now."""
    overrides = [*args.overrides, *([f"model.path={args.model}"] if args.model else [])]
    load_config(None, overrides)  # fail fast on a bad override
    return overrides


def _bench_headline(args: argparse.Namespace) -> None:
    """``asyncrl bench headline``: time to a target accuracy, asynchronous arms against the best
    synchronous arm (``bench/headline.py``)."""
    from asyncrl.bench import async_bench, headline

    if args.samples_per_prompt is not None and args.samples_per_prompt < 1:
        raise ConfigError("--samples-per-prompt must be >= 1")
    if args.reanalyse and args.reevaluate:
        raise ConfigError("--reanalyse and --reevaluate: one at a time")
    if args.reanalyse:
        headline.reanalyse(args.reanalyse)
        return
    if args.reevaluate:
        from asyncrl.bench.reevaluate import reevaluate

        if not args.json:
            raise ConfigError("--reevaluate needs --json: where the re-evaluated analysis goes")
        etas = tuple(int(x) for x in args.etas.split(",")) if args.etas else None
        reevaluate(args.reevaluate, args.json, samples_per_prompt=args.samples_per_prompt or 8, etas=etas)
        return
    overrides = _bench_overrides(args)
    workload = args.workload or "reason"
    if async_bench.WORKLOAD_ALIASES.get(workload, workload) not in async_bench.WORKLOADS:
        raise ConfigError(f"unknown workload {workload!r} (available: {', '.join(async_bench.WORKLOADS)})")
    if args.snapshot_every <= 0:
        raise ConfigError("--snapshot-every must be > 0: the accuracy curves are evaluated from the snapshots")
    if args.sync_setting and args.sync_setting not in headline.SYNC_CANDIDATES:
        raise ConfigError(f"--sync-setting {args.sync_setting!r}: one of {', '.join(headline.SYNC_CANDIDATES)}")
    if args.time_budget_s is not None and args.time_budget_s <= 0:
        raise ConfigError("--time-budget-s must be > 0 (leave it out for step budgets alone)")
    headline.run_headline_bench(
        args.json, overrides=overrides, workload=workload, steps=args.steps,
        etas=tuple(int(x) for x in args.etas.split(",")) if args.etas else (0, 2, 4, 8),
        seeds=tuple(int(x) for x in args.seeds.split(",")) if args.seeds else (0, 1, 2),
        snapshot_every_s=args.snapshot_every, warmup_s=_warmup(args), target_fraction=args.target_fraction,
        probe_steps=args.probe_steps, sync_setting=args.sync_setting, time_budget_s=args.time_budget_s or 0.0,
        snapshot_samples_per_prompt=args.samples_per_prompt, out_dir=args.out or "runs/bench-headline",
    )  # fmt: skip


def _bench_ablation(args: argparse.Namespace) -> None:
    """``asyncrl bench ablation``: objectives x lags x lrs x seeds under controlled staleness."""
    from asyncrl.bench import ablation

    if args.reanalyse:
        ablation.reanalyse(args.reanalyse)
        return
    overrides = _bench_overrides(args)
    objectives = tuple(args.objectives.split(",")) if args.objectives else ablation.DEFAULT_OBJECTIVES
    unknown = [o for o in objectives if o not in ablation.OBJECTIVES]
    if unknown:
        raise ConfigError(f"unknown objective(s) {unknown} (available: {', '.join(ablation.OBJECTIVES)})")
    try:
        lags = tuple(int(x) for x in args.lags.split(",")) if args.lags else ablation.DEFAULT_LAGS
        lrs = tuple(float(x) for x in args.lrs.split(",")) if args.lrs else None
        seeds = tuple(int(x) for x in args.seeds.split(",")) if args.seeds else (0, 1, 2)
    except ValueError as exc:
        raise ConfigError(f"bench ablation: --lags/--seeds take integers, --lrs numbers: {exc}") from exc
    for lr in lrs or ():  # each arm's learning rate checked now, not when its first run starts
        load_config(None, [*overrides, f"trainer.lr={lr!r}"])
    extra = {"out_dir": args.out} if args.out else {}
    if args.reuse:
        extra["reuse"] = args.reuse
    if args.staleness not in ablation.STALENESS_MODES:
        available = ", ".join(ablation.STALENESS_MODES)
        raise ConfigError(f"bench ablation: --staleness {args.staleness!r} (available: {available})")
    ablation.run_ablation(
        args.json, overrides=overrides, objectives=objectives, lags=lags, lrs=lrs, seeds=seeds, steps=args.steps,
        collapse_fraction=args.collapse_fraction, staleness=args.staleness, **extra,
    )  # fmt: skip
