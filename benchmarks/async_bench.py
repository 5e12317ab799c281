"""``python -m benchmarks async``: whole training runs compared side by side.

Owns the controller-level benchmark of DESIGN §8 and its command (``add_arguments``, ``run``), and
``workload_overrides`` (a named workload's run: its warm-started policy, ``data.workloads``, the
user's ``--set``). Every row is a real ``asyncrl train`` run
(``launch.local.train``, in this process, one after the other, each in its own run directory
under ``--out``/<timestamp>/: a fresh directory per invocation, so that running a bench twice never
mixes two runs in one directory) on the same model, data and seed; only the varied parameter
changes.

``controller.max_staleness`` in {0, 1, 2, 4, 8} on two workloads (rows carry
  ``workload``, ``max_staleness``, ``high_water_batches``, ``high_water_unit``, ``interrupt_mode``
  and ``seed``):
  ``task`` (alias ``a``): the default task as configured (trainer-bound on 2 CPU cores);
  ``long`` (alias ``b``): generation-bound, long-tailed long responses: problems of up to 256
  operands (``task.max_terms=256``, ``task.length_tail=0.98``), up to 2048 new tokens, B = 8, from
  a policy warm-started on these very problems (``WARM_STARTS``) so that it writes their long
  worked solutions: responses of a few hundred tokens at the median and a tail to 2048
  (the workloads are ``data.workloads``). Every
  generated group is trained (``algo.filter_equal_rewards=false``): the synchronous run waits for
  each batch's longest responses, as on GPUs. The tiny policy solves almost none of these
  problems, so held-out accuracy is not the point of this workload (a small eval: 64 prompts, one
  sample); the point is the throughput of the loop. The controller runs as suits a
  generation-bound loop on a CPU (both settings leave max_staleness = 0 unchanged, where nothing
  is in flight at an update and the mark never binds): the high-water mark counts samples still
  generating (``controller.high_water_unit=samples``: a group waiting for its one long sample
  does not hold the engine's slots) and in-flight updates keep the KV cache
  (``rollout.interrupt_mode=keep``: ``abort`` re-prefills every running sample at every update;
  with ~110 samples of ~600 tokens running that halved the CPU engine's throughput, 1131 against
  2395 generated tok/s; docs/controller.md §5.2.1).
  Metrics: ``steady_state_tokens_per_s`` (the paper's effective throughput, measured so that
  pipeline inventory cannot flatter it: tokens *generated* in the window from ``warmup_s``
  seconds of RL time to the end of the last step, times the run's trained tokens per generated
  token, over the window; ``controller/throughput.py``), ``trained_tokens_per_s`` (trained tokens over
  the whole run's RL wall time), held-out ``accuracy_after``; with several seeds, ``summary``
  gives mean, spread and 95% interval per (max_staleness, high water) and the accuracy
  difference to max_staleness = 0 paired by seed. ``limits`` gives the bottleneck limit
  min(trainer alone, engine alone) in trained tokens/s: "trainer alone" is trained tokens per
  second of training + weight sync in the synchronous runs (nothing else runs then, and the
  trainer has the core it also gets when the two overlap); "engine alone" is a calibration of
  the engine kept at full occupancy with no trainer (generated tokens/s, from the engine's own
  counter) times the trained tokens per generated token of the synchronous runs (filtered groups
  cost generation and train nothing). ``fraction_of_limit`` = steady-state throughput / limit.

``interrupt`` (in-flight updates against draining) is ``interrupt.py``, on these workloads.

It prints a table and, with ``--json FILE``, writes ``{"bench", "rows", "ratios", ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from typing import Any

from asyncrl.config import ConfigError
from asyncrl.data.workloads import WARM_STARTS, WORKLOAD_ALIASES, WORKLOADS
from benchmarks import options
from benchmarks.options import add_json, add_out, add_overrides, add_seeds, add_steps, add_warmup, parse_list
from benchmarks.runs import fresh_out, mean_or_zero, print_table, run_and_measure, write_json
from benchmarks.stats import mean_ci95

__all__ = ["add_arguments", "run", "run_async_bench", "workload_overrides"]


def _policy_dir(overrides: list[str], workload: str) -> str:
    """The warm-started policy of ``workload`` (built once and cached, see ``WARM_STARTS``)."""
    from asyncrl.config import load_config
    from asyncrl.launch.warm_start import ensure_policy

    return str(ensure_policy(load_config(None, [*WARM_STARTS[workload], *overrides])))


def workload_overrides(overrides: list[str], workload: str) -> list[str]:
    """The overrides of a run of ``workload``: its policy, its ``WORKLOADS`` entry, then the user's
    ``overrides`` (``--set``, ``--model``), which win over the workload's."""
    return [f"model.path={_policy_dir(overrides, workload)}", *WORKLOADS[workload], *overrides]


def row_identity(workload: str, seed: int, overrides: list[str]) -> dict[str, Any]:
    """What identifies a row of ``bench async``: the workload, the seed, and the controller
    settings that differ between rows, as the run's config resolves them."""
    from asyncrl.config import load_config

    cfg = load_config(None, overrides)
    return {
        "workload": workload,
        "max_staleness": cfg.controller.max_staleness,
        "high_water_batches": cfg.controller.high_water_batches,
        "seed": seed,
        "high_water_unit": cfg.controller.high_water_unit,
        "interrupt_mode": cfg.rollout.interrupt_mode,
    }


async def _engine_alone(overrides: list[str], seconds: float, max_fill_s: float = 600.0) -> dict[str, float]:
    """Generated tokens/s of the engine kept at full occupancy (``controller.max_concurrent``
    groups queued, refilled as they finish), no trainer: the engine counter's growth over
    ``seconds`` (calibration of the generation limit), measured once every queued group has
    finished at least once (at most ``max_fill_s``), so that the mix of short and long contexts
    is the steady one rather than a cold start's, where every response is still short (for
    ``long`` the two agreed within the spread: 2669 vs 2725 generated tok/s)."""
    from asyncrl.config import load_config
    from asyncrl.controller.scoring import make_score_fn
    from asyncrl.data.prompts import PromptSource, build_task, drop_long_prompts
    from asyncrl.launch.stages import build_engine, configure_threads, load_model
    from asyncrl.launch.warm_start import ensure_policy
    from asyncrl.models import stop_token_ids
    from asyncrl.rollout.sampling import SamplingParams
    from asyncrl.rollout.workflow import run_episode

    cfg = load_config(None, overrides)
    configure_threads(cfg)  # the engine's threads in the runs (run.torch_threads)
    model, tok = load_model(cfg, ensure_policy(cfg))
    engine = build_engine(cfg, model, tok)  # the runs' engine: same slots, context, mode and device
    train_prompts, _, _ = build_task(cfg.task, tok)
    source = PromptSource(drop_long_prompts(train_prompts, cfg.rollout.max_prompt_len), cfg.run.seed)
    score = make_score_fn("arithmetic", tok)
    sampling = SamplingParams(
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        stop_token_ids=stop_token_ids(tok, model),
    )
    stop = False
    n_workers = cfg.controller.max_concurrent
    first_done = 0
    warm = asyncio.Event()

    async def worker() -> None:
        nonlocal first_done
        first = True
        while not stop:
            await run_episode(engine, source.next(), sampling, cfg.rollout.group_size, score, 0)
            if first:
                first, first_done = False, first_done + 1
                if first_done == n_workers:
                    warm.set()

    t_start = time.perf_counter()
    workers = [asyncio.create_task(worker()) for _ in range(n_workers)]
    try:
        with contextlib.suppress(TimeoutError):  # measure anyway past the cap
            await asyncio.wait_for(warm.wait(), max_fill_s)
        fill_s = time.perf_counter() - t_start
        g0, t0 = engine.stats()["generated_tokens"], time.perf_counter()
        await asyncio.sleep(seconds)
        g1, t1 = engine.stats()["generated_tokens"], time.perf_counter()
        util = engine.stats()["slot_utilisation"]
    finally:
        stop = True
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        engine.close()
    return {
        "engine_alone_generated_tokens_per_s": (g1 - g0) / (t1 - t0),
        "engine_alone_slot_utilisation": util,
        "engine_alone_fill_s": fill_s,
    }


def _std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (workload, max_staleness, high_water_batches) over seeds: mean, spread (sample std) and
    95% interval of the steady-state and whole-run throughput and of held-out accuracy; the
    ratios to max_staleness = 0, paired by seed (mean and 95% interval); and the accuracy
    difference to max_staleness = 0 paired by seed."""
    out: list[dict[str, Any]] = []
    for w in dict.fromkeys(r["workload"] for r in rows):
        w_rows = [r for r in rows if r["workload"] == w]
        sync = {r["seed"]: r for r in w_rows if r["max_staleness"] == 0}
        for eta, hw in dict.fromkeys((r["max_staleness"], r.get("high_water_batches")) for r in w_rows):
            e_rows = [r for r in w_rows if r["max_staleness"] == eta and r.get("high_water_batches") == hw]
            steady = [r["steady_state_tokens_per_s"] for r in e_rows if r["steady_state_tokens_per_s"] is not None]
            acc = [r["accuracy_after"] for r in e_rows if r["accuracy_after"] is not None]
            item: dict[str, Any] = {
                "workload": w,
                "max_staleness": eta,
                "high_water_batches": hw,
                "seeds": [r["seed"] for r in e_rows],
                "steady_state_tokens_per_s_mean": mean_or_zero(steady),
                "steady_state_tokens_per_s_std": _std(steady),
                "steady_state_tokens_per_s_ci95": mean_ci95(steady),
                "trained_tokens_per_s_mean": mean_or_zero([r["trained_tokens_per_s"] for r in e_rows]),
                "accuracy_after_mean": mean_or_zero(acc),
                "accuracy_after_std": _std(acc),
                "staleness_mean": mean_or_zero([r["staleness_mean"] for r in e_rows]),
            }
            paired = [(r, sync[r["seed"]]) for r in e_rows if r["seed"] in sync]
            if paired:
                for key, name in (("steady_state_tokens_per_s", "steady_state"), ("trained_tokens_per_s", "whole_run")):
                    ratios = [r[key] / max(s[key], 1e-9) for r, s in paired if None not in (r[key], s[key])]
                    item[f"{name}_ratio_vs_sync"] = mean_ci95(ratios)
                    item[f"{name}_ratio_vs_sync_per_seed"] = ratios
                deltas = [
                    100 * (r["accuracy_after"] - s["accuracy_after"])
                    for r, s in paired
                    if r["accuracy_after"] is not None and s["accuracy_after"] is not None
                ]
                item["accuracy_delta_vs_sync_points_mean"] = mean_or_zero(deltas)
                item["accuracy_delta_vs_sync_points_std"] = _std(deltas)
                item["accuracy_delta_vs_sync_points_ci95"] = mean_ci95(deltas)
            out.append(item)
    return out


def _variants(etas: tuple[int, ...], high_waters: tuple[int, ...] | None) -> list[tuple[int, int | None]]:
    """(max_staleness, high_water_batches override) pairs: every mark for max_staleness > 0."""
    out: list[tuple[int, int | None]] = []
    for eta in etas:
        out.extend([(eta, None)] if eta == 0 or not high_waters else [(eta, h) for h in high_waters])
    return out


def run_async_bench(
    json_path: str | None,
    *,
    overrides: list[str] | None = None,
    etas: tuple[int, ...] = (0, 1, 2, 4, 8),
    workloads: tuple[str, ...] = ("task", "long"),
    steps: int | None = None,
    seeds: tuple[int, ...] = (0,),
    warmup_s: float = 60.0,
    high_waters: tuple[int, ...] | None = None,
    out_dir: str = "runs/bench-async",
    calibrate_s: float = 30.0,
) -> dict[str, Any]:
    """The max_staleness sweep on each workload, each seed (see the module docstring); the runs
    of one seed are side by side (seed-major order), so load drift hits every max_staleness.
    ``high_waters``: values of ``controller.high_water_batches`` to run each max_staleness > 0
    with (None: the config's); max_staleness = 0 runs once (the mark does not bind there). The
    run directories go under a new ``out_dir/<timestamp>/``."""
    base = list(overrides or [])
    out = fresh_out(out_dir)
    if steps is not None:
        base.append(f"controller.total_steps={steps}")
    rows: list[dict[str, Any]] = []
    limits: dict[str, Any] = {}
    for w in (WORKLOAD_ALIASES.get(w, w) for w in workloads):
        wl = workload_overrides(base, w)
        w_rows = []
        for seed in seeds:
            for eta, hw in _variants(etas, high_waters):
                print(f"\n=== bench async: workload {w}, seed {seed}, max_staleness={eta}, high water {hw} ===")
                run_overrides = [*wl, f"run.seed={seed}", f"controller.max_staleness={eta}"]
                if hw is not None:
                    run_overrides.append(f"controller.high_water_batches={hw}")
                row = row_identity(w, seed, run_overrides)
                run_dir = out / f"{w}-s{seed}-eta{eta}-hw{row['high_water_batches']}"
                row.update(run_and_measure(run_overrides, run_dir, warmup_s))
                w_rows.append(row)
        rows.extend(w_rows)
        syncs = [r for r in w_rows if r["max_staleness"] == 0]
        if syncs and calibrate_s > 0:
            engine = asyncio.run(_engine_alone(wl, calibrate_s))
            trainer = mean_or_zero([r["trainer_alone_tokens_per_s"] for r in syncs])
            per_generated = mean_or_zero([r["trained_per_generated_token"] for r in syncs])
            gen = engine["engine_alone_generated_tokens_per_s"] * per_generated
            limit = min(trainer, gen)
            limits[w] = {
                "trainer_alone_tokens_per_s": trainer,
                "engine_alone_trained_tokens_per_s": gen,
                **engine,
                "bottleneck": "trainer" if trainer <= gen else "engine",
                "bottleneck_limit_tokens_per_s": limit,
            }
            for r in w_rows:
                r["fraction_of_limit"] = r["steady_state_tokens_per_s"] / max(limit, 1e-9)
    summary = summarize(rows)
    for item in summary:
        if item["workload"] in limits:
            limit = limits[item["workload"]]["bottleneck_limit_tokens_per_s"]
            item["fraction_of_limit"] = item["steady_state_tokens_per_s_mean"] / max(limit, 1e-9)
    keys = [
        "workload",
        "seed",
        "max_staleness",
        "high_water_batches",
        "steady_state_tokens_per_s",
        "trained_tokens_per_s",
        "accuracy_after",
        "staleness_mean",
        "stale_groups",
        "unused_groups",
        "response_len_p50",
        "rl_wall_s",
    ]
    print_table("bench async: runs (steady state: generated in the window x trained per generated)", rows, keys)
    keys = [
        "workload",
        "max_staleness",
        "high_water_batches",
        "steady_state_tokens_per_s_mean",
        "fraction_of_limit",
        "accuracy_after_mean",
        "accuracy_after_std",
        "accuracy_delta_vs_sync_points_mean",
        "accuracy_delta_vs_sync_points_std",
    ]
    print_table("bench async: over seeds", summary, keys)
    print(json.dumps({"limits": limits}, indent=2))
    payload = {
        "bench": "async",
        "overrides": base,
        "seeds": list(seeds),
        "warmup_s": warmup_s,
        "rows": rows,
        "summary": summary,
        "limits": limits,
        "out_dir": str(out),
    }
    write_json(json_path, payload)
    return payload


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The grid (``--etas``, ``--workload``, ``--seeds``, ``--high-water``), the runs (``--set``, ``--model``,
    ``--steps``, ``--out``), the window (``--warmup-s``) and the calibration (``--calibrate``)."""
    add_json(parser)
    add_overrides(parser, "model directory of every run (default: each workload's own warm start)")
    add_steps(parser)
    parser.add_argument("--etas", help="comma-separated max_staleness values (default 0,1,2,4,8)")
    parser.add_argument("--workload", help=f"comma-separated workloads (default task,long; {', '.join(WORKLOADS)})")
    add_seeds(parser, "0")
    add_warmup(parser)
    parser.add_argument(
        "--high-water",
        help="controller.high_water_batches values for max_staleness > 0 (default: config)",
    )
    parser.add_argument(
        "--calibrate",
        type=float,
        default=30.0,
        help="seconds of the engine-alone calibration (0: none)",
    )
    add_out(parser, "runs/bench-async")


def run(args: argparse.Namespace) -> None:
    """The grid checked, then every run of it."""
    etas = parse_list(args.etas, int, (0, 1, 2, 4, 8), "--etas")
    workloads = tuple(args.workload.split(",")) if args.workload else ("task", "long")
    unknown = set(workloads) - set(WORKLOADS) - set(WORKLOAD_ALIASES)
    if unknown:
        raise ConfigError(f"unknown workload(s) {sorted(unknown)} (available: {', '.join(WORKLOADS)})")
    seeds = parse_list(args.seeds, int, (0,), "--seeds")
    marks = parse_list(args.high_water, int, (), "--high-water") or None
    run_async_bench(
        args.json,
        overrides=options.overrides(args),
        steps=args.steps,
        out_dir=args.out,
        etas=etas,
        workloads=workloads,
        seeds=seeds,
        warmup_s=args.warmup_s,
        high_waters=marks,
        calibrate_s=args.calibrate,
    )
