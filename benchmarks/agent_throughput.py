"""``python -m benchmarks agent-throughput``: trained tokens/s of multi-turn training when tools are slow,
asynchronous (η = 4) against the best synchronous setting (η = 0), per seed side by side (issue 18).

The workload (``WORKLOAD``): calculator episodes (``rollout.workflow=agent``, ``task.name=calculator``,
the ``tag`` call format: a call, the tool's result, an answer) of the tiny policy after the short warm
start that ``bench prefix-reuse`` uses (the same cached policy), every call answered after a simulated
wait drawn from a long-tailed distribution (``agent.tool_latency=lognormal``, median 0.2 s, sigma 1:
90th percentile 0.7 s, 99th 2 s; seeded per episode, so both arms of a seed draw the same waits for
the same episodes). Every group is trained (``algo.filter_equal_rewards=false``: the warm-started
policy rarely answers right, and this bench measures throughput, not learning).

1. **The synchronous setting.** As ``bench headline`` does it (``headline.probe_sync`` over
   ``headline.SYNC_CANDIDATES``, imported, not repeated): η = 0 once per candidate (seed ``seeds[0]``,
   ``probe_steps`` steps), the one with the highest whole-run trained tokens/s wins; or ``sync_setting``
   names one without probing.
2. **The arms, seed-major.** Per seed, η = 0 at that setting, then η = 4 at ``headline.ASYNC_SETTING``
   (engine thread and trainer process, one core each), the same steps, data order and seed.
3. **The numbers.** Per run, ``throughput.measure_throughput`` (steady state: tokens generated in the
   window from ``warmup_s`` seconds of RL time to the end, x trained per generated, over the window;
   and whole run: trained tokens over RL wall time) and the tool waits of its ledger
   (``controller.tool_waits``: waits per episode, median and 90th percentile, and ``tool_wait_share``,
   the share of the episodes' time in flight spent waiting on a tool). Per seed, the η = 4 / η = 0
   ratios; over seeds, their mean with a 95% t-interval (``stats.mean_ci95``) and the seeds at 2x.
   The JSON and a plot (tokens/s per arm and seed; ratios against the 2x line) are written.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from asyncrl.config import ConfigError, load_config
from asyncrl.results import write_with_plot
from benchmarks import options
from benchmarks.options import (
    add_json,
    add_out,
    add_overrides,
    add_reanalyse,
    add_seeds,
    add_steps,
    add_warmup,
    parse_list,
)
from benchmarks.stats import mean_ci95

__all__ = [
    "add_arguments",
    "analyse",
    "ASYNC_ETA",
    "PLOTTED",
    "reanalyse",
    "run",
    "run_agent_throughput_bench",
    "TARGET_RATIO",
    "tool_wait_row",
    "WORKLOAD",
]

WORKLOAD = (
    # the warm start of bench prefix-reuse (the cache key: task, sft, call format, environment)
    "rollout.workflow=agent",
    "task.name=calculator",
    "agent.tool_format=tag",
    "task.train_size=2048",
    "sft.steps=100",
    "sft.batch_size=16",
    "sft.warmup_steps=10",
    # the episodes: a call, the result, the answer (at most 3 turns of <= 32 tokens)
    "agent.max_turns=3",
    "agent.max_tokens=96",
    "agent.max_turn_tokens=32",
    "rollout.max_new_tokens=32",
    "rollout.temperature=1.0",
    "rollout.group_size=8",
    "rollout.max_slots=64",
    # slow tools: a long-tailed wait per call
    "agent.tool_latency=lognormal",
    "agent.tool_latency_median_s=0.2",
    "agent.tool_latency_sigma=1.0",
    # training: every group trained; a small held-out set (before and after only)
    "algo.filter_equal_rewards=false",
    "trainer.lr=1e-4",
    "controller.batch_size=8",
    "controller.checkpoint_every=0",
    "task.eval_size=16",
    "eval.greedy=true",
    "eval.report_greedy=false",
    "eval.max_new_tokens=32",
    "run.progress=false",
)
"""Config overrides of every run (the user's ``--set`` wins over them)."""

ASYNC_ETA = 4
"""``controller.max_staleness`` of the asynchronous arm (issue 18's criterion)."""

TARGET_RATIO = 2.0
"""Issue 18's criterion: the asynchronous arm's steady-state trained tokens/s at least this x the synchronous."""


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def tool_wait_row(ledger: list[dict[str, Any]], timeline: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's tool waits from its ledger and timeline: waits per finished episode, their median and 90th
    percentile (seconds), and ``tool_wait_share`` (``controller.tool_waits.tool_wait_share``)."""
    from asyncrl.controller.throughput import FINISHED
    from asyncrl.controller.tool_waits import tool_wait_share, tool_waits

    episodes = [line for line in ledger if line.get("status") in FINISHED and "turns" in line]
    durations = [end - start for start, end in tool_waits(episodes)]
    return {
        "episodes": len(episodes),
        "tool_waits_per_episode": len(durations) / len(episodes) if episodes else 0.0,
        "tool_wait_p50_s": _quantile(durations, 0.5),
        "tool_wait_p90_s": _quantile(durations, 0.9),
        "tool_wait_share": tool_wait_share(ledger, timeline),
    }


def _ratio(row: dict[str, Any], sync: dict[str, Any], key: str) -> float | None:
    a, s = row.get(key), sync.get(key)
    return a / s if a is not None and s else None


def analyse(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per seed the asynchronous / synchronous ratios of steady-state and whole-run trained tokens/s;
    over seeds their means with 95% intervals, each arm's throughput and tool-wait share, and the seeds
    whose steady-state ratio reaches ``TARGET_RATIO``. Rows: ``seed``, ``max_staleness`` (0 or not),
    ``steady_state_tokens_per_s`` (None: no window), ``trained_tokens_per_s``, ``tool_wait_share``."""
    by_seed: dict[int, dict[str, dict[str, Any]]] = {}
    for row in rows:
        by_seed.setdefault(row["seed"], {})["sync" if row["max_staleness"] == 0 else "async"] = row
    per_seed = []
    for seed, arms in sorted(by_seed.items()):
        if "sync" not in arms or "async" not in arms:
            continue
        sync, fast = arms["sync"], arms["async"]
        per_seed.append(
            {
                "seed": seed,
                "steady_state_ratio": _ratio(fast, sync, "steady_state_tokens_per_s"),
                "whole_run_ratio": _ratio(fast, sync, "trained_tokens_per_s"),
                "sync_tool_wait_share": sync.get("tool_wait_share"),
                "async_tool_wait_share": fast.get("tool_wait_share"),
            }
        )

    def over(values: list[Any]) -> dict[str, Any]:
        return mean_ci95([v for v in values if v is not None])

    arms: dict[str, Any] = {}
    for name in ("sync", "async"):
        arm_rows = [r for r in rows if (r["max_staleness"] == 0) == (name == "sync")]
        keys = ("steady_state_tokens_per_s", "trained_tokens_per_s", "tool_wait_share", "staleness_mean")
        arms[name] = {key: over([r.get(key) for r in arm_rows]) for key in keys}
    steady = over([s["steady_state_ratio"] for s in per_seed])
    return {
        "per_seed": per_seed,
        "summary": {
            "steady_state_ratio": steady,
            "whole_run_ratio": over([s["whole_run_ratio"] for s in per_seed]),
            "arms": arms,
            "target_ratio": TARGET_RATIO,
            "seeds_at_target": [s["seed"] for s in per_seed if (s["steady_state_ratio"] or 0.0) >= TARGET_RATIO],
            "mean_at_target": steady["mean"] is not None and steady["mean"] >= TARGET_RATIO,
            "interval_above_target": steady["low"] is not None and steady["low"] >= TARGET_RATIO,
        },
    }


def plot(payload: dict[str, Any], path: Path) -> None:
    """Left: steady-state and whole-run trained tokens/s per seed and arm; right: the ratios per seed,
    their mean with its 95% interval, and the 2x line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    seeds = sorted({r["seed"] for r in payload["rows"]})
    runs = {(r["seed"], "sync" if r["max_staleness"] == 0 else "async"): r for r in payload["rows"]}
    width = 0.2
    for i, seed in enumerate(seeds):
        for j, (arm, colour) in enumerate((("sync", "tab:gray"), ("async", "tab:blue"))):
            row = runs.get((seed, arm))
            if row is None:
                continue
            x = i + (j - 0.5) * 2 * width
            left.bar(
                x - width / 2,
                row.get("steady_state_tokens_per_s") or 0.0,
                width,
                color=colour,
                label=f"{arm}: steady state" if i == 0 else None,
            )
            left.bar(
                x + width / 2,
                row["trained_tokens_per_s"],
                width,
                color=colour,
                alpha=0.4,
                hatch="//",
                label=f"{arm}: whole run" if i == 0 else None,
            )
    left.set_xticks(range(len(seeds)), [f"seed {s}" for s in seeds])
    left.set_ylabel("trained tokens / s")
    left.legend(fontsize=7)
    for k, (key, marker) in enumerate((("steady_state_ratio", "o"), ("whole_run_ratio", "s"))):
        points = [(s["seed"], s[key]) for s in payload["per_seed"] if s[key] is not None]
        if points:
            right.scatter(
                [seeds.index(p[0]) + 0.1 * k for p in points],
                [p[1] for p in points],
                marker=marker,
                label=key.replace("_", " "),
            )
        stat = payload["summary"][key]
        if stat["low"] is not None:
            right.errorbar(
                [len(seeds) + 0.1 * k],
                [stat["mean"]],
                yerr=[[stat["mean"] - stat["low"]], [stat["high"] - stat["mean"]]],
                fmt=marker,
                color="k",
                capsize=4,
            )
    right.axhline(TARGET_RATIO, color="r", linestyle="--", label=f"{TARGET_RATIO:g}x")
    right.set_xticks(range(len(seeds) + 1), [*(f"seed {s}" for s in seeds), "mean (95% CI)"])
    right.set_xlim(-0.5, len(seeds) + 0.5)
    right.set_ylabel(f"η={ASYNC_ETA} / η=0")
    right.set_ylim(bottom=0)
    right.legend(fontsize=7)
    fig.suptitle(
        f"calculator with slow tools: asynchronous (η={ASYNC_ETA}) vs synchronous trained tokens/s", fontsize=10
    )
    from asyncrl.controller.report import save_figure

    save_figure(fig, path)


def _arm_row(
    seed: int, eta: int, setting: str, extra: list[str], base: list[str], run_dir: Path, warmup_s: float
) -> dict[str, Any]:
    """One run of an arm: ``runs.run_and_measure``'s row and its tool waits."""
    from asyncrl.controller.rundir import read_jsonl
    from benchmarks.runs import run_and_measure

    over = [*base, *extra, f"run.seed={seed}", f"controller.max_staleness={eta}"]
    row: dict[str, Any] = {"seed": seed, "max_staleness": eta, "setting": setting, "overrides": extra}
    row.update({k: v for k, v in run_and_measure(over, run_dir, warmup_s).items() if k != "snapshots"})
    row.update(tool_wait_row(read_jsonl(run_dir / "trajectories.jsonl"), read_jsonl(run_dir / "timeline.jsonl")))
    return row


def run_agent_throughput_bench(
    json_path: str | None,
    *,
    overrides: list[str] | None = None,
    seeds: tuple[int, ...] = (0, 1, 2),
    steps: int = 40,
    warmup_s: float = 20.0,
    probe_steps: int = 0,
    sync_setting: str | None = None,
    out_dir: str = "runs/bench-agent-throughput",
) -> dict[str, Any]:
    """The benchmark (see the module docstring); ``probe_steps`` 0: the probes run ``steps`` steps.
    Writes ``json_path`` and a PNG beside it."""
    from asyncrl.controller.run_claim import fresh_subdir
    from benchmarks.headline import ASYNC_SETTING, SYNC_CANDIDATES, probe_sync

    base = [*WORKLOAD, *(overrides or []), f"controller.total_steps={steps}"]
    out = fresh_subdir(out_dir)
    print(f"bench agent-throughput: run directories under {out}", flush=True)
    probes: list[dict[str, Any]] = []
    if sync_setting is None:
        sync_setting, probes = probe_sync(base, seeds[0], probe_steps or steps, out, warmup_s)
    elif sync_setting not in SYNC_CANDIDATES:
        raise ValueError(f"sync setting {sync_setting!r}: expected one of {', '.join(SYNC_CANDIDATES)}")
    rows = []
    for seed in seeds:
        for eta, setting, extra in (
            (0, sync_setting, SYNC_CANDIDATES[sync_setting]),
            (ASYNC_ETA, "async", ASYNC_SETTING),
        ):
            print(f"\n=== bench agent-throughput: seed {seed}, max_staleness={eta} ({setting}) ===", flush=True)
            rows.append(_arm_row(seed, eta, setting, extra, base, out / f"s{seed}-eta{eta}", warmup_s))
    payload: dict[str, Any] = {
        "bench": "agent-throughput",
        "overrides": base,
        "seeds": list(seeds),
        "steps": steps,
        "warmup_s": warmup_s,
        "sync_setting": sync_setting,
        "sync_probes": probes,
        "rows": rows,
        "out_dir": str(out),
    }
    return _finish(payload, json_path)


def _finish(payload: dict[str, Any], json_path: str | None, *, replace: bool = False) -> dict[str, Any]:
    """The analysis of ``payload``'s rows, printed; the JSON and its plot written to ``json_path`` (never over a
    file: ``output.write_with_plot``; ``replace``: ``--reanalyse``, the previous file kept beside)."""
    payload.update(analyse(payload["rows"]))
    _print_summary(payload)
    if json_path:
        text = json.dumps(payload, indent=2, default=str) + "\n"
        write_with_plot(json_path, text, lambda png: plot(payload, png), replace=replace)
    return payload


def reanalyse(json_path: str) -> dict[str, Any]:
    """Recompute a finished JSON in place (the previous file kept beside it) from its run directories
    (``runs.resolve_run_dir``: throughput with the current ``measure_throughput``, tool waits with the current
    ``tool_wait_row``) without running anything again; records that it did."""
    import time

    from asyncrl.controller.rundir import read_jsonl
    from asyncrl.controller.throughput import FINISHED, generated_tokens, measure_throughput
    from benchmarks.runs import resolve_run_dir

    payload = json.loads(Path(json_path).read_text())
    for row in payload["rows"]:
        run_dir = resolve_run_dir(row["run_dir"], json_path)
        metrics, timeline = read_jsonl(run_dir / "metrics.jsonl"), read_jsonl(run_dir / "timeline.jsonl")
        ledger = read_jsonl(run_dir / "trajectories.jsonl")
        try:
            row.update(measure_throughput(metrics, ledger, timeline, warmup_s=payload["warmup_s"]).as_row())
        except ValueError as exc:  # shorter than the warm-up: the row keeps no window, as run_and_measure's
            row.update({"steady_state_tokens_per_s": None, "steady_state_error": str(exc)})
        generated = sum(generated_tokens(r) for r in ledger if r["status"] in FINISHED)
        row["trained_per_generated_token"] = row["trained_tokens"] / max(1, generated)
        row.update(tool_wait_row(ledger, timeline))
    payload.setdefault("reanalysed", []).append(time.strftime("%Y-%m-%d %H:%M:%S"))
    return _finish(payload, json_path, replace=True)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _print_summary(payload: dict[str, Any]) -> None:
    print(f"\nbench agent-throughput: synchronous setting {payload['sync_setting']}")
    print(
        f"{'seed':>4} {'eta':>3} {'steady tok/s':>12} {'whole tok/s':>11} {'tool share':>10} {'waits/ep':>8} "
        f"{'wait p50':>8} {'wait p90':>8} {'RL s':>6}"
    )
    for r in payload["rows"]:
        print(
            f"{r['seed']:>4} {r['max_staleness']:>3} {_fmt(r.get('steady_state_tokens_per_s')):>12} "
            f"{_fmt(r['trained_tokens_per_s']):>11} {_fmt(r['tool_wait_share']):>10} "
            f"{_fmt(r['tool_waits_per_episode']):>8} {_fmt(r['tool_wait_p50_s']):>8} "
            f"{_fmt(r['tool_wait_p90_s']):>8} {r['rl_wall_s']:>6.0f}"
        )
    summary = payload["summary"]
    for key in ("steady_state_ratio", "whole_run_ratio"):
        stat = summary[key]
        interval = f" [{_fmt(stat['low'])}, {_fmt(stat['high'])}]" if stat["low"] is not None else ""
        print(f"{key}: mean {_fmt(stat['mean'])}{interval} over {stat['n']} seeds")
    share = {arm: _fmt(stat["tool_wait_share"]["mean"]) for arm, stat in summary["arms"].items()}
    print(
        f"tool-wait share (of the episodes' time in flight): synchronous {share['sync']}, asynchronous {share['async']}"
    )
    print(f"seeds at {TARGET_RATIO:g}x (steady state): {summary['seeds_at_target']}")


PLOTTED = True
"""The plot is written beside the result file (its ``.png``)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json``, the runs (``--set``, ``--model``, ``--steps``, ``--seeds``, ``--warmup-s``, ``--out``), the
    synchronous arm (``--sync-setting``, ``--probe-steps``), ``--reanalyse``."""
    add_json(parser)
    add_overrides(parser)
    add_steps(parser, "training steps per run (default 40)")
    add_seeds(parser, "0,1,2")
    add_warmup(parser, 20.0)
    parser.add_argument("--sync-setting", help="the synchronous setting, without probing (headline.SYNC_CANDIDATES)")
    parser.add_argument("--probe-steps", type=int, default=0, help="steps of each synchronous probe (0: --steps)")
    add_out(parser, "runs/bench-agent-throughput")
    add_reanalyse(parser)


def run(args: argparse.Namespace) -> None:
    """``--reanalyse FILE``, or the options checked (the overrides against the workload) and every seed run."""
    from benchmarks.headline import SYNC_CANDIDATES

    if args.reanalyse:
        reanalyse(args.reanalyse)
        return
    seeds = parse_list(args.seeds, int, (0, 1, 2), "--seeds")
    if args.sync_setting and args.sync_setting not in SYNC_CANDIDATES:
        raise ConfigError(f"--sync-setting {args.sync_setting!r}: one of {', '.join(SYNC_CANDIDATES)}")
    base = options.overrides(args)
    load_config(None, [*WORKLOAD, *base])  # fail fast on an override the workload refuses
    run_agent_throughput_bench(
        args.json,
        overrides=base,
        seeds=seeds,
        steps=args.steps or 40,
        warmup_s=args.warmup_s,
        probe_steps=args.probe_steps,
        sync_setting=args.sync_setting,
        out_dir=args.out,
    )
