"""The command line of the simulator: ``asyncrl simulate``.

Owns the ``simulate`` sub-parser and the command's body, so that the CLI only registers them.
This module imports nothing heavy at import time (``asyncrl --help`` stays instant).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from asyncrl.config import ConfigError


def add_parser(sub: Any) -> None:
    """Register ``asyncrl simulate`` on the CLI's sub-parsers."""
    p = sub.add_parser(
        "simulate", help="discrete-event simulation of the asynchronous loop over a cost profile (docs/simulator.md)"
    )
    p.add_argument("--scenario", help="YAML file of scenario keys (sim/scenario.py: Scenario)")
    p.add_argument("--config", help="take controller.* and rollout.* from a training config YAML")
    p.add_argument("--from-run", help="take a finished run's config, ledger lengths, filter rate and prompt length")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="scenario key, e.g. --set max_staleness=8 --set profile=h800-7b --set gpus=512 (repeatable)",
    )
    p.add_argument("--out", help="write a run directory here (asyncrl report RUN_DIR plots it)")
    p.add_argument("--json", help="write the result (and the scenario) as JSON here")
    p.add_argument("--list-profiles", action="store_true", help="list the shipped cost profiles and exit")
    p.set_defaults(func=run)


def _scenario(args: argparse.Namespace) -> Any:
    from asyncrl.config import load_config
    from asyncrl.sim.scenario import from_config, from_run, load_scenario, with_overrides

    sources = [x for x in (args.scenario, args.config, args.from_run) if x]
    if len(sources) > 1:
        raise ConfigError("simulate: give at most one of --scenario, --config, --from-run")
    if args.from_run:
        return with_overrides(from_run(args.from_run), args.overrides)
    if args.config:
        return with_overrides(from_config(load_config(args.config)), args.overrides)
    return load_scenario(args.scenario, args.overrides)


def run(args: argparse.Namespace) -> int:
    from asyncrl.sim.profile import builtin_profiles
    from asyncrl.sim.run import simulate

    if args.list_profiles:
        print("\n".join(builtin_profiles()))
        return 0
    try:
        scenario = _scenario(args)
        sim = simulate(scenario, run_dir=args.out)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    r = sim.result
    s = sim.scenario
    print(
        f"profile {r.profile}: {s.engines} engines x {s.slots} slots, {s.trainer_ranks} trainer ranks, "
        f"B={s.batch_size}x{s.group_size}, max_staleness={s.max_staleness}, high_water_batches="
        f"{'adaptive' if s.adaptive else s.high_water_batches} ({s.high_water_unit}), {s.interrupt_mode}, "
        f"{s.weight_sync}"
    )
    rows = [
        ("steps", f"{r.steps} in {r.sim_time_s:,.1f} simulated s"),
        (
            "effective throughput",
            f"{r.steady_state_tokens_per_s:,.0f} trained tokens/s steady state "
            f"(from {r.window_start_s:,.1f} s), {r.whole_run_tokens_per_s:,.0f} whole run",
        ),
        ("staleness", f"mean {r.staleness_mean:.2f}, max {r.max_staleness_seen}, by groups {r.staleness_hist}"),
        (
            "admission",
            f"eta {r.eta_mean:.2f}, mark {r.high_water_mean:.2f} batches (means over steps"
            f"{', adaptive' if s.adaptive else ''})",
        ),
        (
            "engines",
            f"busy {r.engine_busy_frac:.1%} (decoding {r.engine_decode_frac:.1%}), occupancy "
            f"{r.engine_occupancy:.1%} ({r.mean_engine_running:,.1f} running), slot utilisation "
            f"{r.slot_utilisation:.1%}",
        ),
        ("trainer", f"busy {r.trainer_busy_frac:.1%} (steps + weight sync)"),
        ("groups", ", ".join(f"{k} {v}" for k, v in r.groups.items())),
        (
            "interruptions",
            f"{r.interruptions_per_sample:.2f} per trained sample, {r.prefill_tokens:,.0f} tokens "
            "prefilled (prompts + abort re-prefills)",
        ),
        ("simulation", f"{r.wall_s:.1f} s wall, {r.cpu_s:.1f} s CPU, {r.events:,} events ({r.events_per_s:,.0f}/s)"),
    ]
    for key, value in rows:
        print(f"  {key:<21} {value}")
    if args.out:
        print(f"run directory: {args.out} (asyncrl report {args.out})")
    if args.json:
        Path(args.json).write_text(json.dumps({"scenario": s.to_dict(), "result": r.as_row()}, indent=2) + "\n")
    return 0
