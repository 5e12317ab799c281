"""The whole asynchronous loop, end to end on CPU with the tiny random-init model.

Checks the walking-skeleton contract: versions advance, the staleness bound holds for every
trained sample (read back from the ledger), losses are finite, the run directory is complete,
synchronous mode (η = 0) never generates while the trainer steps and η > 0 does, and every
admitted prompt is accounted for; with the trainer in its own process (default) and as a thread.
Also: the admission high-water mark holds (and without it the engine runs further ahead), and
``controller.eval_every`` logs held-out accuracy into metrics.jsonl.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict

import pytest

from asyncrl.config import load_config
from asyncrl.controller.rundir import read_jsonl
from asyncrl.launch.local import train


def _cfg(model_dir, run_dir, max_staleness: int, steps: int = 4, trainer_process: bool = True, extra=()):
    return load_config(
        None,
        [
            f"controller.trainer_process={str(trainer_process).lower()}",
            f"model.path={model_dir}",
            f"run.run_dir={run_dir}",
            f"controller.max_staleness={max_staleness}",
            f"controller.total_steps={steps}",
            "controller.batch_size=4",
            "controller.max_concurrent=16",
            "rollout.group_size=4",
            "rollout.max_new_tokens=24",
            "rollout.max_slots=32",
            "eval.max_new_tokens=24",
            "task.eval_size=8",
            "task.train_size=500",
            "algo.filter_equal_rewards=false",
            "run.progress=false",
            *extra,
        ],
    )


@pytest.mark.parametrize(("max_staleness", "trainer_process"), [(0, True), (2, True), (2, False)])
def test_loop_runs_and_respects_staleness(tiny_policy_dir, tmp_path, max_staleness: int, trainer_process: bool) -> None:
    run_dir = tmp_path / f"run-eta{max_staleness}"
    out_dir, summary = train(_cfg(tiny_policy_dir, run_dir, max_staleness, trainer_process=trainer_process))
    assert out_dir == run_dir
    for name in ("config.yaml", "metrics.jsonl", "trajectories.jsonl", "summary.json"):
        assert (run_dir / name).is_file(), name
    assert (run_dir / "checkpoint" / "config.json").is_file()

    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    assert [m["version"] for m in metrics] == [1, 2, 3, 4]
    assert all(math.isfinite(m["loss"]) for m in metrics)

    ledger = read_jsonl(run_dir / "trajectories.jsonl")
    trained = [r for r in ledger if r["status"] == "trained"]
    assert len(trained) == 4 * 4 * 4  # steps x groups x samples
    for r in trained:
        assert r["trained_step"] - r["min_version"] <= max_staleness
        assert r["min_version"] <= r["max_version"] <= r["trained_step"]
    per_prompt = defaultdict(set)
    for r in trained:
        per_prompt[r["prompt_id"]].add(r["sample_idx"])
    assert all(len(v) == 4 for v in per_prompt.values())  # every sample of a trained group, once

    summary_file = json.loads((run_dir / "summary.json").read_text())
    for key in ("accuracy_before", "accuracy_after", "steps", "wall_s", "trained_tokens_per_s", "max_staleness_seen"):
        assert key in summary_file
    assert summary_file["steps"] == 4
    assert summary_file["max_staleness_seen"] <= max_staleness
    assert summary["trained_tokens_per_s"] > 0

    if max_staleness == 2 and trainer_process:  # the report reads a real run directory
        from asyncrl.controller.report import make_report

        plots = make_report(run_dir)
        assert sorted(p.name for p in plots) == ["reward.png", "staleness.png", "throughput.png", "timeline.png"]
        assert all(p.stat().st_size > 10_000 for p in plots)

    overlap = sum(m["generated_tokens_during_train"] for m in metrics)
    if max_staleness == 0:
        assert max(r["trained_step"] - r["min_version"] for r in trained) == 0
        assert overlap == 0  # synchronous: nothing generates while the trainer steps
    else:
        assert overlap > 0  # asynchronous: generation continues during training steps


@pytest.mark.parametrize("high_water_batches", [1, 0])
def test_high_water_mark_bounds_buffered_plus_running(tiny_policy_dir, tmp_path, high_water_batches: int) -> None:
    """η = 4 lets the engine run 5 batches ahead; a mark of one batch (4 groups) keeps buffered +
    running groups at or under 4 in every metrics line and timeline sample. Without the mark the
    same run goes past 4 (so the check can fail)."""
    run_dir = tmp_path / f"hw{high_water_batches}"
    extra = [f"controller.high_water_batches={high_water_batches}", "rollout.max_new_tokens=48"]
    train(_cfg(tiny_policy_dir, run_dir, 4, steps=4, extra=extra))
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    timeline = read_jsonl(run_dir / "timeline.jsonl")
    ahead = [m["buffer_groups"] + m["running_groups"] for m in metrics]
    ahead += [t["buffer_groups"] + t["running_groups"] for t in timeline]
    trained = [r for r in read_jsonl(run_dir / "trajectories.jsonl") if r["status"] == "trained"]
    assert len(trained) == 4 * 4 * 4
    assert all(r["trained_step"] - r["min_version"] <= 4 for r in trained)  # the staleness bound still holds
    if high_water_batches:
        assert max(ahead) <= 4
    else:
        assert max(ahead) > 4


def test_high_water_in_samples_counts_only_samples_still_generating(tiny_policy_dir, tmp_path) -> None:
    """``controller.high_water_unit=samples``: the samples generating never reach the mark (one
    batch = 16 samples) plus a group (round-up) in any timeline sample, they are back to zero
    whenever no group runs, every admitted sample is accounted for, and the staleness bound holds."""
    run_dir = tmp_path / "hw-samples"
    extra = ["controller.high_water_batches=1", "controller.high_water_unit=samples", "rollout.max_new_tokens=48"]
    train(_cfg(tiny_policy_dir, run_dir, 4, steps=4, extra=extra))
    timeline = read_jsonl(run_dir / "timeline.jsonl")
    assert max(t["generating_samples"] for t in timeline) <= 16 + 3
    assert any(t["generating_samples"] > 0 for t in timeline)
    assert all(t["generating_samples"] == 0 for t in timeline if t["running_groups"] == 0)
    assert all(t["generating_samples"] <= 4 * t["running_groups"] for t in timeline)
    trained = [r for r in read_jsonl(run_dir / "trajectories.jsonl") if r["status"] == "trained"]
    assert len(trained) == 4 * 4 * 4
    assert all(r["trained_step"] - r["min_version"] <= 4 for r in trained)


def test_eval_every_logs_held_out_accuracy(tiny_policy_dir, tmp_path) -> None:
    run_dir = tmp_path / "eval-every"
    train(_cfg(tiny_policy_dir, run_dir, 1, steps=4, extra=["controller.eval_every=2"]))
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    evaluated = [m["step"] for m in metrics if "eval_accuracy" in m]
    assert evaluated == [1]  # after 2 steps; after 4 (the last) the launcher's accuracy_after
    m = metrics[1]
    assert 0.0 <= m["eval_accuracy"] <= 1.0 and m["eval_response_len"] > 0 and m["eval_s"] > 0


def test_policy_snapshots_are_saved_with_their_version_and_time(tiny_policy_dir, tmp_path) -> None:
    """``controller.snapshot_every_s``: the starting policy, policies at least that far apart in RL
    time, and the final one, each a loadable Hugging Face checkpoint listed with version and time."""
    from asyncrl.models import load_policy

    run_dir = tmp_path / "snapshots"
    train(_cfg(tiny_policy_dir, run_dir, 1, steps=4, extra=("controller.snapshot_every_s=1e-6",)))
    snaps = read_jsonl(run_dir / "snapshots.jsonl")
    assert [s["version"] for s in snaps] == [0, 1, 2, 3, 4]  # every version: the interval is tiny
    assert snaps[0]["t"] < 1.0 and all(a["t"] <= b["t"] for a, b in zip(snaps, snaps[1:], strict=False))
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    for snap in snaps[1:]:  # version v is published at the end of step v - 1, after step v - 2 ended
        assert snap["t"] <= metrics[snap["version"] - 1]["time_s"]
        assert snap["version"] == 1 or snap["t"] >= metrics[snap["version"] - 2]["time_s"]
    model, _ = load_policy(snaps[2]["path"])
    assert sum(p.numel() for p in model.parameters()) > 0

    sparse = tmp_path / "sparse"
    train(_cfg(tiny_policy_dir, sparse, 1, steps=4, extra=("controller.snapshot_every_s=3600",)))
    assert [s["version"] for s in read_jsonl(sparse / "snapshots.jsonl")] == [0, 4]  # start and end only
