"""``asyncrl report RUN_DIR``: PNG plots of a run, read from its run directory only (refused,
``controller.run_claim.MixedRunDir``, where the directory holds lines of more than one run).

- ``reward.png``: accuracy of every scored rollout sample per step (filtered groups included, so
  dynamic sampling does not bias it) and of the trained batch, against RL wall time, with the
  held-out accuracy before and after RL (from ``summary.json``) as markers;
- ``throughput.png``: trained tokens/s per step and since the start (the effective throughput),
  generated tokens/s per step, against wall time;
- ``staleness.png``: distribution of ``trained_step - min_version`` over trained samples (the
  ledger), with the configured bound;
- ``timeline.png``: engine running samples and waiting requests, trainer step and weight-sync
  spans, rewards in flight, buffer and in-flight groups on one time axis (like the AReaL
  paper's Figure 1), so the overlap of generation and training shows; in a multi-turn run, the
  episodes waiting on a tool (hatched, from the ledger's ``tool_wait`` intervals,
  ``controller.tool_waits``) beside the engine's running samples;
- ``tools.png`` (multi-turn runs only): held-out accuracy (before, every ``controller.eval_every``
  steps, after) above the rates of tool calls (correct, hitting the needed result, malformed) and the
  share of episodes that call the tool at all, of the rollouts per step and of the held-out episodes,
  and turns per episode, against RL wall time.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from asyncrl.controller.run_claim import check_one_run, read_jsonl
from asyncrl.controller.tool_waits import tool_waits, waiting_over_time


def _load(run_dir: Path) -> tuple[list[dict], list[dict], list[dict], dict[str, Any], dict[str, Any]]:
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    ledger = read_jsonl(run_dir / "trajectories.jsonl")
    timeline = read_jsonl(run_dir / "timeline.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    config: dict[str, Any] = {}
    if (run_dir / "config.yaml").is_file():
        import yaml

        config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    return metrics, ledger, timeline, summary, config


def make_report(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write the plots of ``run_dir`` (into ``out_dir``, default ``run_dir/plots``); return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = Path(run_dir)
    if not (run / "metrics.jsonl").is_file():
        raise FileNotFoundError(f"{run} is not a run directory (no metrics.jsonl)")
    check_one_run(run)  # MixedRunDir: plots over two runs' lines would be wrong
    out = Path(out_dir) if out_dir else run / "plots"
    out.mkdir(parents=True, exist_ok=True)
    metrics, ledger, timeline, summary, config = _load(run)
    if not metrics:
        raise FileNotFoundError(f"{run}/metrics.jsonl has no training steps yet")
    eta = config.get("controller", {}).get("max_staleness")

    written = [
        _accuracy_plot(plt, metrics, summary, config, out / "reward.png"),
        _throughput_plot(plt, metrics, out / "throughput.png"),
        _staleness_plot(plt, ledger, eta, out / "staleness.png"),
    ]
    written.append(_timeline(plt, metrics, timeline, config, out / "timeline.png", tool_waits(ledger)))
    if any("episode_turns_mean" in m for m in metrics):
        written.append(_tool_use(plt, metrics, summary, out / "tools.png"))
    return written


def _accuracy_plot(plt: Any, metrics: list[dict], summary: dict[str, Any], config: dict[str, Any], path: Path) -> Path:
    """Rollout and trained-batch accuracy against wall time, with held-out accuracy before and after."""
    eta = config.get("controller", {}).get("max_staleness")
    t = [m["time_s"] for m in metrics]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    rollout = [(m["time_s"], m["rollout_accuracy"]) for m in metrics if m.get("rollout_accuracy") is not None]
    if rollout:
        ax.plot(*zip(*rollout, strict=True), label="rollout accuracy (every scored sample)", color="tab:blue")
        ax.plot(
            *zip(*_smooth(rollout), strict=True), color="tab:blue", linewidth=2.5, alpha=0.5, label="  moving average"
        )
    filtered = config.get("algo", {}).get("filter_equal_rewards")
    label = "trained-batch accuracy" + (" (after dynamic sampling: biased to mixed groups)" if filtered else "")
    ax.plot(t, [m["accuracy"] for m in metrics], label=label, color="tab:orange", alpha=0.6, linestyle="--")
    if summary.get("accuracy_before") is not None:
        ax.scatter([0], [summary["accuracy_before"]], color="k", marker="o", zorder=3, label="held-out before RL")
    if summary.get("accuracy_after") is not None:
        ax.scatter(
            [t[-1]], [summary["accuracy_after"]], color="r", marker="*", s=120, zorder=3, label="held-out after RL"
        )
    ax.set_xlabel("RL wall time (s)")
    ax.set_ylabel("accuracy (fraction of reward 1)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"Accuracy against wall time (max_staleness={eta}, {len(metrics)} steps)")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def _throughput_plot(plt: Any, metrics: list[dict], path: Path) -> Path:
    """Trained and generated tokens per second against wall time."""
    t = [m["time_s"] for m in metrics]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    step_rate = [m.get("trained_tokens_per_s_step") for m in metrics]
    if all(v is not None for v in step_rate):
        ax.plot(t, step_rate, label="trained tokens/s (per step)", color="tab:blue", alpha=0.5)
    ax.plot(
        t,
        [m["trained_tokens_per_s"] for m in metrics],
        label="effective: trained tokens/s (since start)",
        color="tab:blue",
        linewidth=2.5,
    )
    ax.plot(
        t,
        [m["generated_tokens_per_s"] for m in metrics],
        label="generated tokens/s (per step)",
        color="tab:green",
        alpha=0.7,
    )
    ax.set_xlabel("RL wall time (s)")
    ax.set_ylabel("tokens / s")
    ax.set_ylim(bottom=0)
    ax.set_title("Throughput (trained: prompt + response tokens of trained samples; generated: new tokens)")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def _staleness_plot(plt: Any, ledger: list[dict], eta: int | None, path: Path) -> Path:
    """How many versions old each trained sample was, against the bound."""
    trained = [r for r in ledger if r.get("status") == "trained" and r.get("min_version") is not None]
    counts = Counter(r["trained_step"] - r["min_version"] for r in trained)
    fig, ax = plt.subplots(figsize=(6, 4))
    if counts:
        keys = list(range(0, max(max(counts), eta or 0) + 1))
        ax.bar(keys, [counts.get(k, 0) for k in keys], color="tab:blue")
        ax.set_xticks(keys)
    if eta is not None:
        ax.axvline(eta + 0.5, color="r", linestyle="--", label=f"bound max_staleness={eta}")
        ax.legend(fontsize=8)
    ax.set_xlabel("staleness of a trained sample (trained step - oldest token version)")
    ax.set_ylabel("samples")
    dropped = len({r["prompt_id"] for r in ledger if r.get("status") == "stale"})
    ax.set_title(f"Staleness of {len(trained)} trained samples ({dropped} groups dropped as stale)", fontsize=10)
    return save_figure(fig, path)


_TOOL_RATES = (
    ("tool_call_correct_rate", "correct calls", "tab:green"),
    ("tool_call_hit_rate", "calls hitting the needed result", "tab:blue"),
    ("tool_call_malformed_rate", "malformed calls", "tab:red"),
    ("episode_tool_call_frac", "episodes that call the tool", "tab:purple"),
)


def _tool_use(plt: Any, metrics: list[dict], summary: dict[str, Any], path: Path) -> Path:
    """Held-out accuracy over the run above the tool-use rates (rollouts per step, held-out points)."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    before, after = summary.get("eval_before") or {}, summary.get("eval_after") or {}
    end = metrics[-1]["time_s"]
    held = [(0.0, before)] if before else []
    held += [
        (m["time_s"], {k[5:]: v for k, v in m.items() if k.startswith("eval_")})
        for m in metrics
        if "eval_accuracy" in m
    ]
    held += [(end, after)] if after else []
    if held:
        top.plot(
            [t for t, _ in held], [e["accuracy"] for _, e in held], marker="o", color="k", label="held-out accuracy"
        )
    top.plot(
        [m["time_s"] for m in metrics],
        [m["accuracy"] for m in metrics],
        color="tab:orange",
        alpha=0.5,
        linestyle="--",
        label="trained-batch accuracy",
    )
    top.set_ylabel("accuracy")
    top.set_ylim(-0.02, 1.02)
    top.legend(fontsize=8)
    for key, label, color in _TOOL_RATES:
        step = [(m["time_s"], m[key]) for m in metrics if m.get(key) is not None]
        if step:
            bottom.plot(*zip(*step, strict=True), color=color, alpha=0.5, label=f"{label} (rollouts)")
        points = [(t, e[key]) for t, e in held if e.get(key) is not None]
        if points:
            bottom.plot(*zip(*points, strict=True), color=color, marker="o", label=f"{label} (held-out)")
    turns = bottom.twinx()
    turns.plot(
        [m["time_s"] for m in metrics],
        [m["episode_turns_mean"] for m in metrics],
        color="gray",
        linestyle=":",
        label="turns per episode (rollouts)",
    )
    turns.set_ylabel("turns per episode")
    turns.set_ylim(bottom=0)
    bottom.set_ylabel("fraction of attempted calls\n(purple: of episodes)")
    bottom.set_ylim(-0.02, 1.02)
    bottom.set_xlabel("RL wall time (s)")
    bottom.legend(fontsize=7, loc="center left")
    turns.legend(fontsize=7, loc="center right")
    top.set_title("Tool use: held-out accuracy and the rates of tool calls", fontsize=10)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return save_figure(fig, path)


def _smooth(points: list[tuple[float, float]], window: int = 5) -> list[tuple[float, float]]:
    """Trailing moving average of (t, y) points."""
    out = []
    for i, (t, _) in enumerate(points):
        part = [y for _, y in points[max(0, i - window + 1) : i + 1]]
        out.append((t, sum(part) / len(part)))
    return out


def _timeline(
    plt: Any,
    metrics: list[dict],
    timeline: list[dict],
    config: dict[str, Any],
    path: Path,
    waits: list[tuple[float, float]],
) -> Path:
    """Engine, trainer, reward and queues on one time axis (like the AReaL paper's Figure 1); ``waits``:
    the tool waits of the ledger, drawn as the count of episodes waiting on a tool."""
    ctrl, rollout = config.get("controller", {}), config.get("rollout", {})
    eta = ctrl.get("max_staleness")
    fig, axes = plt.subplots(4, 1, figsize=(11, 7.5), sharex=True, height_ratios=[2, 1, 1, 1.5])
    if timeline:
        tt = [s["t"] for s in timeline]
        axes[0].fill_between(
            tt, [s["engine_running"] for s in timeline], step="post", alpha=0.6, label="running samples (decoding)"
        )
        if "engine_waiting" in timeline[0]:
            axes[0].plot(
                tt,
                [s["engine_waiting"] for s in timeline],
                drawstyle="steps-post",
                color="tab:gray",
                label="waiting requests (a group, or one resubmitted sample)",
            )
        if waits:
            wt, waiting = waiting_over_time(waits)
            axes[0].fill_between(
                wt,
                waiting,
                step="post",
                facecolor="none",
                edgecolor="tab:purple",
                hatch="///",
                linewidth=0.8,
                label="episodes waiting on a tool",
            )
        if rollout.get("max_slots"):
            axes[0].axhline(rollout["max_slots"], color="k", linestyle=":", linewidth=1, label="decode slots")
        axes[0].legend(fontsize=7, loc="upper right")
        rewards = [s["reward_in_flight"] for s in timeline]
        axes[2].plot(tt, rewards, drawstyle="steps-post", color="tab:green")
        if not any(rewards):
            verifier = config.get("task", {}).get("verifier", "?")
            note = f"verifier '{verifier}' scores inline in microseconds: never seen in flight"
            axes[2].text(
                0.5, 0.75, note, transform=axes[2].transAxes, ha="center", va="center", fontsize=8, color="tab:green"
            )
        axes[3].plot(tt, [s["buffer_groups"] for s in timeline], drawstyle="steps-post", label="buffer (groups)")
        axes[3].plot(tt, [s["running_groups"] for s in timeline], drawstyle="steps-post", label="in flight (groups)")
        if ctrl.get("max_concurrent"):
            axes[3].axhline(
                ctrl["max_concurrent"], color="tab:orange", linestyle=":", linewidth=1, label="max_concurrent"
            )
        axes[3].legend(fontsize=7, loc="upper right")
    axes[0].set_ylabel("engine")
    for m in metrics:
        start = m.get("train_start_s", m["time_s"] - m["train_step_s"] - m["weight_sync_s"])
        axes[1].broken_barh([(start, m["train_step_s"])], (0.1, 0.8), color="tab:orange")
        axes[1].broken_barh([(start + m["train_step_s"], m["weight_sync_s"])], (0.1, 0.8), color="tab:red")
    axes[1].set_yticks([])
    axes[1].set_ylabel("trainer\nstep | sync")
    axes[2].set_ylabel("reward\nin flight")
    axes[3].set_ylabel("queues")
    axes[3].set_xlabel("RL wall time (s)")
    axes[0].set_title(
        f"Activity timeline (max_staleness={eta}): engine, trainer (orange: step, red: weight sync), reward, queues",
        fontsize=9,
    )
    for ax in axes:
        ax.grid(alpha=0.3)
    return save_figure(fig, path)


def save_figure(fig: Any, path: str | Path) -> Path:
    """Lay ``fig`` out, write it to ``path`` (its folder made) at the project's resolution and close it:
    every plot of the reports, benches and simulator ends here."""
    import matplotlib.pyplot as plt

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
