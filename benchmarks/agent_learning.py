"""``python -m benchmarks agent-learning``: does RL teach the tiny policy to use the calculator, within a wall budget?

The task is the config's: ``task.name=calculator`` (the project's own problems, ``configs/calculator.yaml``) or
``task.name=reasoning_gym`` (reasoning-gym's generated problems, ``task.datasets``; with
``rollout.workflow=agent agent.env=calculator`` the calculator tool, ``configs/reasoning_gym_calculator.yaml``,
or single-turn without it, where the tool figures are absent). The warm start demonstrates the task's training
problems in either case (``launch.warm_start``).

Per seed, one after the other (issue 18's learning criterion):

1. **Warm start, timed.** The tiny policy is built and fine-tuned on worked calculator conversations
   (``launch.warm_start.run_warm_start``: the task's training problems, loss on the assistant turns)
   into the seed's directory, fresh (never a cached one: its time is part of the budget), on every
   core (torch's intra-op threads; RL then runs at ``run.torch_threads`` per stage), with its
   second stage when the config has one (``sft.second_stage_steps``: ``configs/calculator_adopt.yaml``
   makes a policy that can copy into the call but seldom makes one) and its restarts (``sft.restart_*``);
   its statistics are the row's ``warm_start`` (final losses, restarts, the seed kept). The config keeps
   it short, so the policy knows the format and RL has room to improve.
2. **RL.** ``asyncrl train`` from that policy (the config's ``rollout.workflow=agent``,
   ``task.name=calculator``): held-out accuracy before RL, the loop (held-out evaluation every
   ``controller.eval_every`` steps, in RL time), held-out accuracy after.
3. **The numbers.** Per seed: accuracy before and after on the held-out problems (disjoint from the
   training ones, ``data.calculator``; ``task.eval_size`` x episodes per prompt), the gain in points,
   the tool-use rates before and after (``controller.metrics.tool_use_rates``; with
   ``episode_tool_call_frac``, the share of episodes that call the tool at all), wall times (warm
   start, RL, evaluations before and after, total; CPU seconds of the warm start and of the run, which
   a loaded machine does not inflate) and whether warm start + RL fit ``budget_s``; what the gain is made
   of (``gain_made_of``: the change in episodes that hit, split into *calling* (more episodes call, at the
   hit rate per calling episode before RL) and *solving* (calling episodes hit more often), and the rest of
   the gain, the answer turn's);
   over seeds, means with 95% t-intervals. A plot of held-out accuracy and the hit rate of tool
   calls against wall time (warm start included) for every seed is written beside the JSON.
4. **By kind.** The held-out evaluation reports each problem kind apart (``by_kind``: accuracy and hit
   rate per kind, ``data.calculator.problem_kind``), so each seed carries them before and after RL
   (``by_kind_before`` / ``by_kind_after``, the gain per kind in points, ``kinds_fell``: the kinds that
   lost accuracy) and at every evaluation between (``curve_by_kind``); over seeds, each kind's accuracy
   before and after. A gain on one kind cannot hide the collapse of another.

The RL step count is the config's (``controller.total_steps``), not cut at the budget: a run that
overran says so (``within_budget``) instead of being truncated.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path
from typing import Any

from asyncrl.results import write_with_plot
from benchmarks import options
from benchmarks.options import add_json, add_out, add_overrides, add_seeds, parse_list
from benchmarks.runs import train_or_stop
from benchmarks.stats import mean_ci95

__all__ = [
    "add_arguments",
    "analyse",
    "check_task",
    "gain_made_of",
    "PLOTTED",
    "run",
    "merge_results",
    "run_agent_learning_bench",
    "seed_row",
    "task_label",
    "TOOL_RATES",
]

TOOL_RATES = (
    "tool_call_correct_rate",
    "tool_call_hit_rate",
    "tool_call_malformed_rate",
    "episode_tool_call_frac",
    "episode_tool_hit_frac",
    "episode_turns_mean",
)
"""Held-out tool-use figures reported before and after RL (``controller.metrics.tool_use_rates``)."""


def seed_row(
    seed: int, summary: dict[str, Any], metrics: list[dict[str, Any]], warm_start_s: float, budget_s: float
) -> dict[str, Any]:
    """One seed's result from its run's ``summary.json`` and ``metrics.jsonl`` (times in seconds)."""
    before, after = summary.get("eval_before") or {}, summary.get("eval_after") or {}
    rl_s = float(summary["rl_wall_s"])
    figures = ("accuracy", "tool_call_hit_rate", "episode_tool_call_frac")
    curve = [(0.0, *(before.get(k) for k in figures))]
    curve += [(m["time_s"], *(m.get(f"eval_{k}") for k in figures)) for m in metrics if "eval_accuracy" in m]
    if after:
        curve.append((rl_s, *(after.get(k) for k in figures)))
    acc_before, acc_after = summary["accuracy_before"], summary["accuracy_after"]
    kinds_before, kinds_after = before.get("by_kind") or {}, after.get("by_kind") or {}
    kind_gain = {
        kind: 100.0 * (kinds_after[kind]["accuracy"] - kinds_before[kind]["accuracy"])
        for kind in kinds_before
        if kind in kinds_after
    }
    kind_curve = [(0.0, before.get("by_kind"))] + [
        (m["time_s"], m["eval_by_kind"]) for m in metrics if "eval_by_kind" in m
    ]
    if after:
        kind_curve.append((rl_s, after.get("by_kind")))
    return {
        "seed": seed,
        "accuracy_before": acc_before,
        "accuracy_after": acc_after,
        "gain_points": 100.0 * (acc_after - acc_before) if acc_after is not None else None,
        "accuracy_mode": summary.get("accuracy_mode"),
        "accuracy_greedy_before": summary.get("accuracy_greedy_before"),
        "accuracy_greedy_after": summary.get("accuracy_greedy_after"),
        **{f"{k}_before": before.get(k) for k in TOOL_RATES},
        **{f"{k}_after": after.get(k) for k in TOOL_RATES},
        "steps": summary["steps"],
        "warm_start_s": warm_start_s,
        "rl_wall_s": rl_s,
        "train_wall_s": warm_start_s + rl_s,
        "total_wall_s": warm_start_s + float(summary["wall_s"]),
        "within_budget": warm_start_s + rl_s <= budget_s,
        "curve": [(warm_start_s + t, *point) for t, *point in curve],
        "by_kind_before": kinds_before or None,
        "by_kind_after": kinds_after or None,
        "kind_gain_points": kind_gain or None,
        "kinds_fell": sorted(kind for kind, gain in kind_gain.items() if gain < 0),
        "curve_by_kind": [
            (warm_start_s + t, {kind: k["accuracy"] for kind, k in kinds.items()}) for t, kinds in kind_curve if kinds
        ],
        "gain_made_of": gain_made_of(before, after),
    }


def gain_made_of(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float] | None:
    """The held-out gain in points split by where it came from (None where the environment tells no hits).

    With c the share of episodes that call and h the share of calling episodes that hit (``episode_tool_hit_frac``
    / ``episode_tool_call_frac``), the change in episodes that hit, c1*h1 - c0*h0, is ``calling_points``
    (c1 - c0) * h0 plus ``solving_points`` c1 * (h1 - h0); ``answer_points`` is the accuracy gain less that change
    (the answer turn got more, or fewer, of the hits right)."""
    keys = ("accuracy", "episode_tool_call_frac", "episode_tool_hit_frac")
    if any(side.get(k) is None for side in (before, after) for k in keys):
        return None

    def per_calling(side: dict[str, Any]) -> float:
        calls = side["episode_tool_call_frac"]
        return side["episode_tool_hit_frac"] / calls if calls > 0 else 0.0

    c0, c1 = before["episode_tool_call_frac"], after["episode_tool_call_frac"]
    h0, h1 = per_calling(before), per_calling(after)
    hits = after["episode_tool_hit_frac"] - before["episode_tool_hit_frac"]
    return {
        "calling_points": 100.0 * (c1 - c0) * h0,
        "solving_points": 100.0 * c1 * (h1 - h0),
        "answer_points": 100.0 * (after["accuracy"] - before["accuracy"] - hits),
        "hit_per_calling_episode_before": h0,
        "hit_per_calling_episode_after": h1,
    }


def analyse(rows: list[dict[str, Any]], budget_s: float, min_gain_points: float = 20.0) -> dict[str, Any]:
    """Means with 95% intervals over seeds, and how many seeds met the criterion (a gain of at least
    ``min_gain_points`` with warm start + RL within ``budget_s``)."""
    keys = [
        "accuracy_before",
        "accuracy_after",
        "gain_points",
        "warm_start_s",
        "rl_wall_s",
        "train_wall_s",
        "total_wall_s",
        "warm_start_cpu_s",
        "run_cpu_s",
    ]
    keys += [f"{k}_{w}" for k in TOOL_RATES for w in ("before", "after")]
    summary = {}
    for key in keys:
        values = [r[key] for r in rows if r.get(key) is not None]
        if values:
            summary[key] = mean_ci95(values)
    made_of = [r["gain_made_of"] for r in rows if r.get("gain_made_of")]
    if made_of:
        summary["gain_made_of"] = {key: mean_ci95([m[key] for m in made_of]) for key in made_of[0]}
    summary.update(_kinds_over_seeds(rows))
    met = [r["seed"] for r in rows if r["within_budget"] and (r["gain_points"] or 0.0) >= min_gain_points]
    rose = {key: _rose(rows, key) for key in ("tool_call_hit_rate", "episode_tool_call_frac", "episode_tool_hit_frac")}
    return {
        "summary": summary,
        "criterion": {
            "min_gain_points": min_gain_points,
            "budget_s": budget_s,
            "seeds_met": met,
            "seeds_hit_rate_rose": rose["tool_call_hit_rate"],
            "seeds_episode_tool_call_frac_rose": rose["episode_tool_call_frac"],
            "seeds_episode_tool_hit_frac_rose": rose["episode_tool_hit_frac"],
            "seeds": [r["seed"] for r in rows],
        },
    }


def _rose(rows: list[dict[str, Any]], key: str) -> list[int]:
    """The seeds whose held-out ``key`` (a ``TOOL_RATES`` figure; absent counts as 0) rose during RL."""
    return [r["seed"] for r in rows if (r[f"{key}_after"] or 0.0) > (r[f"{key}_before"] or 0.0)]


def _kinds_over_seeds(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``by_kind``: per problem kind, held-out accuracy before and after RL, the gain in points and (where the
    environment tells hits) the per-call hit rate before and after, each a mean with its 95% interval over the seeds
    that evaluated the kind (absent: no seed had kinds; a side's hit rate is left out unless every such seed has
    one, so that its mean is over the same seeds as the accuracy's)."""
    kinds = sorted({kind for r in rows for kind in (r.get("kind_gain_points") or {})})
    out: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        mine = [r for r in rows if kind in (r.get("kind_gain_points") or {})]
        out[kind] = {
            "accuracy_before": mean_ci95([r["by_kind_before"][kind]["accuracy"] for r in mine]),
            "accuracy_after": mean_ci95([r["by_kind_after"][kind]["accuracy"] for r in mine]),
            "gain_points": mean_ci95([r["kind_gain_points"][kind] for r in mine]),
        }
        for side in ("before", "after"):
            hits = [r[f"by_kind_{side}"][kind].get("tool_call_hit_rate") for r in mine]
            if all(h is not None for h in hits):
                out[kind][f"tool_call_hit_rate_{side}"] = mean_ci95(hits)
    return {"by_kind": out} if out else {}


def plot_curves(rows: list[dict[str, Any]], path: Path, budget_s: float, task: str = "calculator") -> None:
    """Held-out accuracy, the hit rate of tool calls and the share of episodes that call the tool against
    wall time (warm start included)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    for i, row in enumerate(rows):
        color = f"C{i}"
        t = [c[0] for c in row["curve"]]
        top.plot(t, [c[1] for c in row["curve"]], marker="o", color=color, label=f"seed {row['seed']}")
        bottom.plot(t, [c[2] for c in row["curve"]], marker="o", color=color, label=f"seed {row['seed']}")
        calls = [(c[0], c[3]) for c in row["curve"] if len(c) > 3 and c[3] is not None]  # older files: none
        if calls:
            bottom.plot(
                *zip(*calls, strict=True),
                marker="x",
                linestyle="--",
                color=color,
                label=f"seed {row['seed']}: episodes calling",
            )
        for ax in (top, bottom):
            ax.axvline(row["warm_start_s"], color=color, alpha=0.3, linestyle=":")
    for ax in (top, bottom):
        ax.axvline(budget_s, color="r", linestyle="--", label=f"budget {budget_s:.0f} s")
        ax.grid(alpha=0.3)
        ax.set_ylim(-0.02, 1.02)
    top.set_ylabel("held-out accuracy")
    top.set_title(
        f"{task}: held-out accuracy during RL ({rows[0]['accuracy_mode']}; dotted: warm start ends)", fontsize=9
    )
    bottom.set_ylabel("held-out tool calls that hit\n(dashed: episodes that call)")
    bottom.set_xlabel("wall time since the warm start began (s)")
    top.legend(fontsize=8)
    from asyncrl.controller.report import save_figure

    save_figure(fig, path)


def _run_seed(config: str | None, overrides: list[str], seed: int, out: Path, budget_s: float) -> dict[str, Any]:
    import torch

    from asyncrl.config import load_config, with_values
    from asyncrl.controller.rundir import read_jsonl
    from asyncrl.launch.stages import configure_threads, usable_cores
    from asyncrl.launch.warm_start import run_warm_start

    seed_dir = out / f"seed{seed}"
    cfg = load_config(config, [*overrides, f"run.seed={seed}", f"sft.seed={seed}", f"run.run_dir={seed_dir / 'run'}"])
    check_task(cfg.task.name, cfg.rollout.workflow)
    warm_start_threads, threads_before = usable_cores(), torch.get_num_threads()
    configure_threads(cfg, warm_start_threads)  # the warm start runs alone: every core, as a user would give it
    try:
        t0, cpu0 = time.perf_counter(), cpu_seconds()
        warm = run_warm_start(cfg, seed_dir / "warm_start")
        warm_start_s, cpu1 = time.perf_counter() - t0, cpu_seconds()
    finally:
        configure_threads(cfg, threads_before)  # RL: ``train`` sets run.torch_threads (0: torch's default, as before)
    print(f"seed {seed}: warm start {warm_start_s:.0f} s", flush=True)
    run_dir, summary = train_or_stop(with_values(cfg, {"model.path": str(seed_dir / "warm_start")}))
    row = seed_row(seed, summary, read_jsonl(run_dir / "metrics.jsonl"), warm_start_s, budget_s)
    return {
        **row,
        "warm_start_cpu_s": cpu1 - cpu0,
        "run_cpu_s": cpu_seconds() - cpu1,
        "warm_start_threads": warm_start_threads,
        "warm_start": warm,
    }


def check_task(task: str, workflow: str) -> None:
    """ConfigError (one line) unless the bench can run ``task`` with ``workflow``: calculator as an agent,
    reasoning_gym either way (see the module docstring)."""
    if task == "calculator" and workflow == "agent" or task == "reasoning_gym":
        return
    from asyncrl.config import ConfigError

    raise ConfigError(
        f"bench agent-learning runs task.name=calculator with rollout.workflow=agent, or "
        f"task.name=reasoning_gym; got task.name={task} with rollout.workflow={workflow}"
    )


def task_label(config: str | None, overrides: list[str]) -> str:
    """The task the bench ran, as its plot and result name it (``reasoning_gym <datasets>``)."""
    from asyncrl.config import load_config

    task = load_config(config, overrides).task
    return f"{task.name} {task.datasets}" if task.name == "reasoning_gym" else task.name


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the trainer process), user + system: what
    the work cost whatever else the machine was running."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def run_agent_learning_bench(
    json_path: str | None,
    *,
    config: str | None,
    overrides: list[str],
    seeds: list[int],
    budget_s: float = 600.0,
    out_dir: str = "runs/bench-agent-learning",
    min_gain_points: float = 20.0,
) -> dict[str, Any]:
    """Warm start + RL on ``calculator`` per seed (see the module docstring); writes ``json_path`` and a
    PNG beside it. The seeds' directories go under a new ``out_dir/<timestamp>``, so that no invocation
    overwrites an earlier one's."""
    from benchmarks.runs import fresh_out

    out = fresh_out(out_dir)
    rows = []
    for seed in seeds:
        rows.append(_run_seed(config, overrides, seed, out, budget_s))
        print(f"seed {seed}: {json.dumps({k: v for k, v in rows[-1].items() if k != 'curve'})}", flush=True)
    task = task_label(config, overrides)
    payload = {
        "bench": "agent-learning",
        "task": task,
        "config": config,
        "overrides": overrides,
        "budget_s": budget_s,
        "rows": rows,
        **analyse(rows, budget_s, min_gain_points),
    }
    if json_path:  # never over a file (``output.write_with_plot``)
        write_with_plot(
            json_path, json.dumps(payload, indent=2) + "\n", lambda png: plot_curves(rows, png, budget_s, task)
        )
    _print_table(payload)
    return payload


def merge_results(paths: list[str], min_gain_points: float = 20.0) -> dict[str, Any]:
    """One result from result files of the same bench configuration (config, overrides, budget) run apart, e.g.
    one seed per process: their rows, analysed over all seeds as one invocation would (``merged_from``: the
    files). ConfigError (one line) for files of different configurations or a seed in two files."""
    from asyncrl.config import ConfigError

    payloads = [json.loads(Path(path).read_text()) for path in paths]
    same = ("bench", "task", "config", "overrides", "budget_s")
    first = payloads[0]
    for path, payload in zip(paths, payloads, strict=True):
        differ = [key for key in same if payload.get(key) != first.get(key)]
        if differ:
            raise ConfigError(f"--merge: {path} differs from {paths[0]} in {', '.join(differ)}")
    rows = [row for payload in payloads for row in payload["rows"]]
    seeds = [row["seed"] for row in rows]
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"--merge: a seed appears twice among {paths} (seeds {seeds})")
    return {
        **{key: first.get(key) for key in same},
        "merged_from": list(paths),
        "rows": rows,
        **analyse(rows, first["budget_s"], min_gain_points),
    }


def _rate(value: float | None) -> str:
    """A rate for the table; "-" where it was not measured (a single-turn run has no tool figures)."""
    return "-" if value is None else f"{value:.3f}"


def _print_table(payload: dict[str, Any]) -> None:
    print(
        f"{'seed':>4} {'before':>7} {'after':>7} {'gain pts':>8} {'hit before':>10} {'hit after':>9} "
        f"{'calling before':>14} {'after':>6} {'warm s':>7} {'restarts':>8} {'RL s':>6} "
        f"{'in budget':>9}"
    )
    for r in payload["rows"]:
        gain = f"{r['gain_points']:.1f}" if r["gain_points"] is not None else "-"
        print(
            f"{r['seed']:>4} {r['accuracy_before']:>7.3f} {r['accuracy_after'] or 0:>7.3f} {gain:>8} "
            f"{_rate(r['tool_call_hit_rate_before']):>10} {_rate(r['tool_call_hit_rate_after']):>9} "
            f"{_rate(r['episode_tool_call_frac_before']):>14} {_rate(r['episode_tool_call_frac_after']):>6} "
            f"{r['warm_start_s']:>7.0f} {(r.get('warm_start') or {}).get('sft_restarts', 0):>8.0f} "
            f"{r['rl_wall_s']:>6.0f} {str(r['within_budget']):>9}"
        )
    gain = payload["summary"].get("gain_points")
    if gain:
        print(f"gain: mean {gain['mean']:.1f} points, 95% CI [{gain['low']}, {gain['high']}] over {gain['n']} seeds")
    print(f"seeds meeting the criterion: {payload['criterion']['seeds_met']}")
    made_of = payload["summary"].get("gain_made_of")
    if made_of:
        parts = [f"{k.removesuffix('_points')} {v['mean']:.1f}" for k, v in made_of.items() if k.endswith("_points")]
        print(f"gain made of (points, mean over seeds): {', '.join(parts)}")
    for kind, k in payload["summary"].get("by_kind", {}).items():
        before, after = k["accuracy_before"]["mean"], k["accuracy_after"]["mean"]
        hits = ""
        if "tool_call_hit_rate_before" in k and "tool_call_hit_rate_after" in k:
            hit0, hit1 = k["tool_call_hit_rate_before"]["mean"], k["tool_call_hit_rate_after"]["mean"]
            hits = f", calls hit {hit0:.3f} -> {hit1:.3f}"
        n = k["gain_points"]["n"]
        print(f"  {kind:>14}: held-out accuracy {before:.3f} -> {after:.3f}{hits} (mean over {n} seeds)")


PLOTTED = True
"""The plot is written beside the result file (its ``.png``)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json``, ``--config``, ``--set``, ``--model``, ``--seeds``, ``--budget-s``, ``--min-gain-points``,
    ``--out``, ``--merge``."""
    add_json(parser)
    parser.add_argument(
        "--config",
        default="configs/calculator.yaml",
        help="YAML config of every run (default %(default)s)",
    )
    add_overrides(parser)
    add_seeds(parser, "0,1,2")
    parser.add_argument("--budget-s", type=float, default=600.0, help="wall budget of warm start + RL per seed")
    parser.add_argument(
        "--min-gain-points",
        type=float,
        default=20.0,
        help="the criterion's least held-out gain, in points (default %(default)s)",
    )
    add_out(parser, "runs/bench-agent-learning")
    parser.add_argument(
        "--merge", metavar="A,B", help="combine result files of one configuration run apart; nothing runs"
    )


def run(args: argparse.Namespace) -> None:
    """Every seed's warm start and RL within the budget; or, with ``--merge``, result files combined."""
    if args.merge:
        payload = merge_results(args.merge.split(","), args.min_gain_points)
        if args.json:
            rows, budget_s = payload["rows"], payload["budget_s"]
            write_with_plot(
                args.json,
                json.dumps(payload, indent=2) + "\n",
                lambda png: plot_curves(rows, png, budget_s, payload["task"] or "calculator"),
            )
        _print_table(payload)
        return
    seeds = list(parse_list(args.seeds, int, (0, 1, 2), "--seeds"))
    run_agent_learning_bench(
        args.json,
        config=args.config,
        overrides=options.overrides(args),
        seeds=seeds,
        budget_s=args.budget_s,
        out_dir=args.out,
        min_gain_points=args.min_gain_points,
    )
