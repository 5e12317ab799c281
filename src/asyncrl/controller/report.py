"""``asyncrl report RUN_DIR``: PNG plots of a run, read from its run directory only.

- ``reward.png``: training reward and accuracy of trained samples per step against wall time,
  with the held-out accuracy before and after RL (from ``summary.json``) as markers;
- ``throughput.png``: trained and generated tokens/s against wall time;
- ``staleness.png``: distribution of ``trained_step - min_version`` over trained samples (the
  ledger), with the configured bound;
- ``timeline.png``: engine running requests, trainer busy spans and rewards in flight on one
  time axis (like the AReaL paper's Figure 1), so the overlap of generation and training shows.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from asyncrl.controller.rundir import read_jsonl


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
    out = Path(out_dir) if out_dir else run / "plots"
    out.mkdir(parents=True, exist_ok=True)
    metrics, ledger, timeline, summary, config = _load(run)
    if not metrics:
        raise FileNotFoundError(f"{run}/metrics.jsonl has no training steps yet")
    eta = config.get("controller", {}).get("max_staleness")
    written: list[Path] = []
    t = [m["time_s"] for m in metrics]

    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(t, [m["reward"] for m in metrics], label="train reward (batch mean)", alpha=0.8)
    ax.plot(t, [m["accuracy"] for m in metrics], label="train accuracy (batch)", alpha=0.6)
    if "accuracy_before" in summary:
        ax.scatter([0], [summary["accuracy_before"]], color="k", marker="o", zorder=3, label="held-out before RL")
        ax.scatter([t[-1]], [summary["accuracy_after"]], color="r", marker="*", s=120, zorder=3,
                   label="held-out after RL")  # fmt: skip
    ax.set_xlabel("wall time since RL start (s)")
    ax.set_ylabel("reward / accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"Reward and accuracy (max_staleness={eta})")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    written.append(_save(fig, out / "reward.png"))

    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(t, [m["trained_tokens_per_s"] for m in metrics], label="trained tokens/s (cumulative average)")
    ax.plot(t, [m["generated_tokens_per_s"] for m in metrics], label="generated tokens/s (per step)", alpha=0.7)
    ax.set_xlabel("wall time since RL start (s)")
    ax.set_ylabel("tokens / s")
    ax.set_ylim(bottom=0)
    ax.set_title("Throughput")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    written.append(_save(fig, out / "throughput.png"))

    trained = [r for r in ledger if r.get("status") == "trained" and r.get("min_version") is not None]
    counts = Counter(r["trained_step"] - r["min_version"] for r in trained)
    fig, ax = plt.subplots(figsize=(6, 4))
    if counts:
        keys = list(range(0, max(counts) + 1))
        ax.bar(keys, [counts.get(k, 0) for k in keys], color="tab:blue")
        ax.set_xticks(keys)
    if eta is not None:
        ax.axvline(eta + 0.5, color="r", linestyle="--", label=f"bound max_staleness={eta}")
        ax.legend(fontsize=8)
    ax.set_xlabel("staleness of a trained sample (trained step - oldest token version)")
    ax.set_ylabel("samples")
    dropped = sum(1 for r in ledger if r.get("status") == "stale")
    ax.set_title(f"Staleness of {len(trained)} trained samples ({dropped} dropped as stale)")
    written.append(_save(fig, out / "staleness.png"))

    fig, axes = plt.subplots(3, 1, figsize=(10, 6), sharex=True)
    if timeline:
        tt = [s["t"] for s in timeline]
        axes[0].fill_between(tt, [s["engine_running"] for s in timeline], step="post", alpha=0.6)
        axes[0].set_ylabel("engine\nrunning")
        axes[2].plot(tt, [s["reward_in_flight"] for s in timeline], drawstyle="steps-post", color="tab:green")
        axes[2].set_ylabel("reward\nin flight")
    for m in metrics:
        start = m.get("train_start_s", m["time_s"] - m["train_step_s"] - m["weight_sync_s"])
        axes[1].broken_barh([(start, m["train_step_s"])], (0.1, 0.8), color="tab:orange")
        axes[1].broken_barh([(start + m["train_step_s"], m["weight_sync_s"])], (0.1, 0.8), color="tab:red")
    axes[1].set_yticks([])
    axes[1].set_ylabel("trainer\n(step|sync)")
    axes[2].set_xlabel("wall time since RL start (s)")
    axes[0].set_title(f"Activity timeline (max_staleness={eta}): engine, trainer, reward")
    for ax in axes:
        ax.grid(alpha=0.3)
    written.append(_save(fig, out / "timeline.png"))
    return written


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
