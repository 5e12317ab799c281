"""``asyncrl plan``: the command line of the planner (``sim/plan.py``), its printed table, JSON and plot.

Owns the ``plan`` sub-parser, the translation of its flags into a ``PlanRequest``, the report of a ``Plan``
(the recommendation with its ``asyncrl train`` overrides, the full table, the JSON that ``python -m benchmarks
plan-check`` reads) and the trade-off plot (predicted throughput against mean staleness, the frontier and
the recommendation marked), and the memory estimate of the recommended run (``launch.memory``: what ``asyncrl
train`` checks at start) for ``--model`` against ``--device-memory-gib`` or this machine's memory. Imports
nothing heavy at import time.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

from asyncrl.config import ConfigError
from asyncrl.config.parse import finite_float


def add_parser(sub: Any) -> None:
    """Register ``asyncrl plan`` on the CLI's sub-parsers."""
    p = sub.add_parser(
        "plan",
        help="recommend the inference:training split, eta, high-water mark and interrupt mode for a "
        "workload on a device budget, by simulation (docs/simulator.md §9)",
    )
    p.add_argument("--profile", default="cpu-2core-tiny", help="cost profile: a shipped name or a JSON file")
    p.add_argument(
        "--workload",
        default="task",
        help="task | long (this machine's bench async workloads) | areal-math (AReaL's GPU setup) | a run "
        "directory (its ledger replayed) | a scenario YAML",
    )
    p.add_argument("--devices", type=int, default=2, help="device budget: engines x engine devices + trainer ranks")
    p.add_argument("--max-staleness", type=int, default=8, help="the bound on eta (no candidate exceeds it)")
    p.add_argument(
        "--target",
        type=finite_float,
        default=0.95,
        help="the rule: candidates predicted at >= this fraction of the best throughput qualify (default 0.95)",
    )
    p.add_argument(
        "--max-mean-staleness", type=finite_float, help="the rule: qualifying candidates' mean staleness cap"
    )
    p.add_argument("--etas", help="comma-separated eta values (default: 0, powers of two below the bound, the bound)")
    p.add_argument("--marks", default="0,1,2,4", help="comma-separated high-water marks in batches (0: none)")
    p.add_argument("--modes", default="abort,keep", help="comma-separated interrupt modes")
    p.add_argument("--splits", help="comma-separated inference fractions to split the devices by")
    p.add_argument("--refine-splits", type=int, default=2, help="splits searched over the whole grid (default 2)")
    p.add_argument("--confirm", type=int, default=8, help="most candidates re-simulated over 3x the horizon")
    p.add_argument("--steps", type=int, default=0, help="simulated steps per searched candidate (0: auto, 20-200)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the plan (recommendation, overrides, every candidate) here")
    p.add_argument("--plot", help="write the throughput / staleness trade-off plot (PNG) here")
    p.add_argument(
        "--model", help="local Hugging Face model directory the memory estimate is for (default: the tiny default)"
    )
    p.add_argument(
        "--device-memory-gib",
        type=finite_float,
        help="memory of each device for the memory estimate (default: read here: CUDA's free memory, or this "
        "machine's available RAM)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _ints(text: str | None, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip()) if text else ()
    except ValueError as exc:
        raise ConfigError(f"{flag} takes comma-separated integers, got {text!r}") from exc


def request_from_args(args: argparse.Namespace) -> Any:
    """The ``PlanRequest`` of the command's flags; bad input raises ``ConfigError`` (or ``FileNotFoundError``
    for an unknown profile)."""
    from asyncrl.sim.plan import DEFAULT_SPLIT_FRACTIONS, PlanRequest
    from asyncrl.sim.plan_workloads import resolve_workload
    from asyncrl.sim.profile import load_profile

    profile = load_profile(args.profile)
    try:
        fractions = tuple(float(x) for x in args.splits.split(",")) if args.splits else DEFAULT_SPLIT_FRACTIONS
        return PlanRequest(
            profile=profile,
            workload=resolve_workload(args.workload),
            devices=args.devices,
            max_staleness=args.max_staleness,
            target_fraction=args.target,
            max_mean_staleness=args.max_mean_staleness,
            etas=_ints(args.etas, "--etas"),
            marks=_ints(args.marks, "--marks"),
            modes=tuple(m.strip() for m in args.modes.split(",") if m.strip()),
            split_fractions=fractions,
            refine_splits=args.refine_splits,
            confirm=args.confirm,
            steps=args.steps,
            seed=args.seed,
        )
    except ValueError as exc:
        raise ConfigError(f"plan: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    from asyncrl.sim.plan import plan

    request = request_from_args(args)
    try:
        result = plan(request, progress=not args.no_progress)
    except ValueError as exc:
        raise ConfigError(f"plan: {exc}") from exc
    payload = {"command_line": command_line(args), **plan_payload(result)}
    if args.model:
        payload["train_command"] += " " + shlex.join(["--model", args.model])
    payload["memory"] = memory_payload(payload, args.model, args.device_memory_gib)
    print_plan(payload)
    print_memory(payload["memory"])
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"plan written to {args.json}")
    if args.plot:
        plot_plan(payload, args.plot)
        print(f"trade-off plot written to {args.plot}")
    return 0


def command_line(args: argparse.Namespace) -> str:
    """The ``asyncrl plan`` command that reproduces a plan (every search flag spelled out)."""
    flags = [
        "profile",
        "workload",
        "devices",
        "max_staleness",
        "target",
        "max_mean_staleness",
        "etas",
        "marks",
        "modes",
        "splits",
        "refine_splits",
        "confirm",
        "steps",
        "seed",
        "model",
        "device_memory_gib",
    ]
    words = ["asyncrl", "plan"]
    for name in flags:
        value = getattr(args, name)
        if value is not None:
            words += [f"--{name.replace('_', '-')}", str(value)]
    return shlex.join(words)


def plan_payload(p: Any) -> dict[str, Any]:
    """The plan as JSON: the request, the rule, the recommendation with its overrides, every candidate."""
    from asyncrl.sim.plan import feasible, setting_overrides

    r, w = p.request, p.request.workload
    confirmed = [x for x in p.predictions if x.phase == "confirm"]
    ok = {id(x) for x in feasible(confirmed, r.target_fraction, r.max_mean_staleness)}
    rows = []
    for pred in sorted(p.predictions, key=lambda x: (x.phase != "confirm", -x.steady_state_tokens_per_s)):
        rows.append(
            {
                **pred.as_row(),
                "qualifies": id(pred) in ok,
                "recommended": pred is p.recommended,
                "overrides": setting_overrides(pred.setting, r),
            }
        )
    rec = next(row for row in rows if row["recommended"])
    planned = {o.split("=", 1)[0] for o in rec["overrides"]}
    workload_sets = [o for o in w.config_overrides if o.split("=", 1)[0] not in planned]
    config = ["--config", w.config_file] if w.config_file else []
    train = ["asyncrl", "train", *config, *(a for o in [*workload_sets, *rec["overrides"]] for a in ("--set", o))]
    return {
        "command": "asyncrl plan",
        "profile": r.profile.name,
        "devices": r.devices,
        "workload": {
            "name": w.name,
            "scenario": w.scenario,
            "config_overrides": list(w.config_overrides),
            "bench_workload": w.bench_workload,
            "config_file": w.config_file,
            "source": w.source,
        },
        "max_staleness": r.max_staleness,
        "target_fraction": r.target_fraction,
        "max_mean_staleness": r.max_mean_staleness,
        "rule": p.rule,
        "steps_per_candidate": p.steps,
        "seed": r.seed,
        "candidates_simulated": len(rows),
        "wall_s": round(p.wall_s, 2),
        "recommended": rec,
        "train_command": shlex.join(train),
        "best_throughput": rows[0],
        "confirm_steps": rows[0]["steps"],
        "candidates": rows,
    }


def memory_payload(d: dict[str, Any], model: str | None, device_memory_gib: float | None) -> dict[str, Any]:
    """The memory estimate (``launch.memory``) of the recommended ``asyncrl train`` command: its config (the
    workload's file and overrides, the recommendation's) with ``model`` (default: the tiny default), against
    ``device_memory_gib`` per device (default: what this machine reports)."""
    from asyncrl.config import load_config
    from asyncrl.launch.memory import check_memory, describe, estimate_memory, model_shape

    w, rec = d["workload"], d["recommended"]
    planned = {o.split("=", 1)[0] for o in rec["overrides"]}
    sets = [o for o in w["config_overrides"] if o.split("=", 1)[0] not in planned] + rec["overrides"]
    if model:
        sets.append(f"model.path={model}")
    cfg = load_config(w["config_file"] or None, sets)
    shape = model_shape(cfg)
    if shape is None:
        raise ConfigError(f"plan: --model {model} has no readable config.json")
    given = None if device_memory_gib is None else (int(device_memory_gib * 2**30), "--device-memory-gib")
    check = check_memory(estimate_memory(cfg, shape), (lambda _device: given) if given else None)
    return {
        "model": model or "the tiny default",
        "params": shape.params,
        "devices": [
            {
                "device": v.need.device,
                "role": v.need.role,
                "count": v.need.count,
                "total_bytes": v.need.total,
                "available_bytes": v.available,
                "source": v.source,
                "fits": v.fits,
                "parts": [{"name": p.name, "bytes": p.bytes, "formula": p.formula} for p in v.need.parts],
            }
            for v in check.verdicts
        ],
        "notes": list(check.estimate.notes),
        "lines": describe(check),
    }


def print_memory(m: dict[str, Any]) -> None:
    print(
        f"\nmemory of the recommended run ({m['model']}, {m['params']:,} parameters; asyncrl train refuses a run "
        "that does not fit):"
    )
    for line in m["lines"]:
        print("  " + line)


def print_plan(d: dict[str, Any]) -> None:
    rec = d["recommended"]
    print(
        f"\nplan: profile {d['profile']}, workload {d['workload']['name']}, {d['devices']} devices, eta <= "
        f"{d['max_staleness']}; {d['candidates_simulated']} candidates x {d['steps_per_candidate']} simulated "
        f"steps (the {sum(r['phase'] == 'confirm' for r in d['candidates'])} confirmed: {d['confirm_steps']}), "
        f"{d['wall_s']:.0f} s"
    )
    print(f"rule: {d['rule']}")
    print(
        f"\nrecommended: {rec['label']}: {rec['steady_state_tokens_per_s']:,.0f} trained tokens/s predicted "
        f"({rec['steady_state_tokens_per_s'] / d['best_throughput']['steady_state_tokens_per_s']:.0%} of the "
        f"best, {d['best_throughput']['label']}), mean staleness {rec['staleness_mean']:.2f}"
    )
    print("overrides:  " + " ".join(f"--set {o}" for o in rec["overrides"]))
    print(f"run it:     {d['train_command']}")
    keys = [
        ("label", 32),
        ("steady_state_tokens_per_s", 12),
        ("staleness_mean", 8),
        ("engine_busy_frac", 8),
        ("trainer_busy_frac", 8),
        ("interruptions_per_sample", 8),
        ("phase", 7),
        ("steps", 5),
    ]
    heads = ["setting", "tokens/s", "stale", "eng busy", "trn busy", "interr", "phase", "steps"]
    print("\n  " + "  ".join(f"{h:>{w}}" for h, (_, w) in zip(heads, keys, strict=True)))
    for row in d["candidates"]:
        mark = "*" if row["recommended"] else ("+" if row["qualifies"] else " ")
        cells = []
        for key, width in keys:
            v = row[key]
            cells.append(
                f"{v:>{width},.0f}"
                if key.endswith("per_s")
                else f"{v:>{width}.2f}"
                if isinstance(v, float)
                else f"{v!s:>{width}}"
            )
        print(mark + " " + "  ".join(cells))
    print("  (* recommended, + qualifies under the rule)")


def frontier(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trade-off frontier: candidates no other beats on both throughput and mean staleness, by staleness."""
    out: list[dict[str, Any]] = []
    for row in sorted(rows, key=lambda r: (r["staleness_mean"], -r["steady_state_tokens_per_s"])):
        if not out or row["steady_state_tokens_per_s"] > out[-1]["steady_state_tokens_per_s"]:
            out.append(row)
    return out


def plot_plan(d: dict[str, Any], path: str | Path) -> Path:
    """Predicted throughput against mean staleness: every candidate, the frontier, the rule's threshold and
    the recommendation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    search = [r for r in d["candidates"] if r["phase"] != "confirm"]
    confirmed = [r for r in d["candidates"] if r["phase"] == "confirm"]
    fig, ax = plt.subplots(figsize=(8, 5))
    for mode, color in (("abort", "tab:red"), ("keep", "tab:blue")):
        pts = [r for r in search if r["interrupt_mode"] == mode]
        ax.scatter(
            [r["staleness_mean"] for r in pts],
            [r["steady_state_tokens_per_s"] for r in pts],
            s=18,
            color=color,
            alpha=0.6,
            label=f"{mode} ({d['steps_per_candidate']} steps)",
        )
    front = frontier(search)
    ax.plot(
        [r["staleness_mean"] for r in front],
        [r["steady_state_tokens_per_s"] for r in front],
        "k-",
        lw=1,
        label="frontier (search)",
    )
    ax.scatter(
        [r["staleness_mean"] for r in confirmed],
        [r["steady_state_tokens_per_s"] for r in confirmed],
        s=40,
        facecolors="none",
        edgecolors="black",
        label=f"confirmed ({d['confirm_steps']} steps)",
    )
    best = d["best_throughput"]["steady_state_tokens_per_s"]
    ax.axhline(
        d["target_fraction"] * best, color="grey", ls="--", lw=0.8, label=f"{d['target_fraction']:.0%} of the best"
    )
    rec = d["recommended"]
    ax.scatter(
        [rec["staleness_mean"]],
        [rec["steady_state_tokens_per_s"]],
        marker="*",
        s=260,
        color="gold",
        edgecolor="black",
        zorder=5,
        label=f"recommended: {rec['label']}",
    )
    ax.set_xlabel("predicted mean staleness (trained step - oldest token version)")
    ax.set_ylabel("predicted effective throughput (trained tokens/s)")
    ax.set_title(
        f"asyncrl plan: {d['profile']}, {d['workload']['name']}, {d['devices']} devices (predicted)", fontsize=10
    )
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    from asyncrl.controller.report import save_figure

    return save_figure(fig, path)
