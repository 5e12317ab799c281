"""Invariant 7 (DESIGN §4): nothing is lost, nothing is trained twice, across a kill and a resume.

A real ``asyncrl train`` process (tiny random-init model, small batches) is killed with SIGKILL
at a random moment (after a random number of training steps plus a random delay, so the kill
lands in generation, training, weight sync or a checkpoint save), then ``asyncrl train --resume``
finishes it. The ledger alone must then show: every prompt of the stream admitted once in order
(no gap in the data position), every admitted prompt with exactly one fate, no sample trained
twice, every step trained once with a full batch, and no trained sample past the staleness
bound. A second test stops a run with SIGTERM (graceful: checkpoint, exit status 143) and
resumes it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from asyncrl.controller.resume import list_checkpoints
from asyncrl.controller.rundir import check_one_run, read_jsonl

STEPS, BATCH, GROUP, ETA = 10, 4, 4, 2


def _args(model_dir: Path) -> list[str]:
    sets = [
        f"model.path={model_dir}",
        f"controller.max_staleness={ETA}",
        f"controller.total_steps={STEPS}",
        f"controller.batch_size={BATCH}",
        "controller.max_concurrent=12",
        "controller.checkpoint_every=2",
        f"rollout.group_size={GROUP}",
        "rollout.max_new_tokens=24",
        "rollout.max_slots=32",
        "eval.max_new_tokens=16",
        "task.eval_size=4",
        "task.train_size=300",
        "algo.filter_equal_rewards=false",
        "run.progress=false",
    ]
    return [arg for s in sets for arg in ("--set", s)]


def _asyncrl(*argv: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from asyncrl.cli import main; sys.exit(main())", *argv]


def _wait_for_steps(proc: subprocess.Popen, metrics: Path, steps: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metrics.is_file() and len(read_jsonl(metrics)) >= steps:
            return
        assert proc.poll() is None, f"training exited early with {proc.returncode}"
        time.sleep(0.02)
    raise AssertionError(f"no {steps} training steps within {timeout}s")


def _resume(run_dir: Path, log: Path) -> dict:
    with open(log, "w") as out:
        rc = subprocess.run(_asyncrl("train", "--resume", str(run_dir)), stdout=out, stderr=subprocess.STDOUT,
                            timeout=120).returncode  # fmt: skip
    assert rc == 0, log.read_text()[-3000:]
    return json.loads((run_dir / "summary.json").read_text())


def _check_admission_bound(ledger: list[dict]) -> None:
    """Replay the staleness gate from the ledger (its lines are written in the gate's order): at
    every admission at version v, groups admitted and not given back (filtered, stale, failed)
    must fit (η + v + 1) * B. After a ``resumed`` marker only trained groups still count (the
    re-admitted ones are counted again when admitted): resetting the counters instead, as AReaL
    did after recovery, breaks this."""
    live, counted_groups = 0, 0
    for r in ledger:
        match r["status"]:
            case "admitted":
                live += 1
                assert live <= (ETA + r["start_version"] + 1) * BATCH, f"admission past the staleness budget: {r}"
            case "resumed":
                live = counted_groups
            case "filtered" | "stale" if r["sample_idx"] == 0:
                live -= 1
            case "engine_failure":
                live -= 1
            case "trained" | "skipped" if r["sample_idx"] == 0:
                counted_groups += 1


def check_ledger(run_dir: Path) -> dict[str, int]:
    """Assert the invariants on the ledger and metrics of a finished run; return some counts."""
    assert check_one_run(run_dir) is not None  # one run (its resumes keep the run id), never two mixed
    ledger = read_jsonl(run_dir / "trajectories.jsonl")
    admitted = [r for r in ledger if r["status"] == "admitted"]
    first = [r for r in admitted if not r["readmitted"]]
    # the data position: the stream was admitted in order, without gaps or repeats
    assert [r["stream_index"] for r in first] == list(range(len(first)))
    index_of = {r["prompt_id"]: r["stream_index"] for r in first}
    assert len(index_of) == len(first), "a prompt id was admitted twice as new"
    for r in admitted:
        if r["readmitted"]:  # only prompts admitted before (and lost with the kill) come back
            assert index_of.get(r["prompt_id"]) == r["stream_index"], r
    _check_admission_bound(ledger)
    fates: dict[str, list[dict]] = defaultdict(list)
    for r in ledger:
        if r["status"] not in ("admitted", "resumed"):
            fates[r["prompt_id"]].append(r)
    assert set(fates) <= set(index_of), "a fate for a prompt never admitted"
    for pid in index_of:
        lines = fates.get(pid)
        assert lines, f"prompt {pid} admitted and lost: no fate in the ledger"
        statuses = {r["status"] for r in lines}
        assert len(statuses) == 1, f"prompt {pid} has several fates: {statuses}"
        if lines[0]["sample_idx"] is None:
            assert len(lines) == 1 and statuses <= {"in_flight", "engine_failure"}
        else:
            assert sorted(r["sample_idx"] for r in lines) == list(range(GROUP)), f"{pid}: samples {lines}"
    trained = [r for r in ledger if r["status"] == "trained"]
    twice = [k for k, n in Counter((r["prompt_id"], r["sample_idx"]) for r in trained).items() if n > 1]
    assert not twice, f"trained twice: {twice[:5]}"
    per_step = Counter(r["trained_step"] for r in trained)
    assert per_step == {s: BATCH * GROUP for s in range(STEPS)}, per_step
    for r in trained:
        assert r["trained_step"] - r["min_version"] <= ETA, f"staleness bound broken after resume: {r}"
        assert r["min_version"] <= r["max_version"] <= r["trained_step"]
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(STEPS))
    return {"admitted": len(first), "readmitted": len(admitted) - len(first), "trained": len(trained)}


def test_sigkill_at_a_random_moment_then_resume(tiny_policy_dir: Path, tmp_path: Path) -> None:
    seed = int(os.environ.get("ASYNCRL_KILL_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    run_dir = tmp_path / "run"
    log = tmp_path / "first.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(_asyncrl("train", "--run-dir", str(run_dir), *_args(tiny_policy_dir)),
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            _wait_for_steps(proc, run_dir / "metrics.jsonl", rng.randint(1, STEPS - 3))
            time.sleep(rng.uniform(0.0, 0.5))
            assert proc.poll() is None, "the run ended before the kill"
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=10) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
    killed_at = len(read_jsonl(run_dir / "metrics.jsonl"))
    ckpts = list_checkpoints(run_dir)
    summary = _resume(run_dir, tmp_path / "resume.log")
    counts = check_ledger(run_dir)
    note = f"seed={seed} killed after {killed_at} steps, checkpoints {[p.name for p in ckpts]}, {counts}"
    assert summary["steps"] == STEPS and summary["max_staleness_seen"] <= ETA, note
    assert summary["resumes"] == (1 if ckpts else 0), note
    if ckpts:  # prompts in flight (or waiting) at the checkpoint were admitted again
        assert counts["readmitted"] > 0, note
    assert summary["accuracy_after"] is not None


def test_sigterm_stops_gracefully_with_a_checkpoint(tiny_policy_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    log = tmp_path / "first.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(_asyncrl("train", "--run-dir", str(run_dir), *_args(tiny_policy_dir)),
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            _wait_for_steps(proc, run_dir / "metrics.jsonl", 3)
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert rc == 128 + signal.SIGTERM, log.read_text()[-3000:]
    stopped = json.loads((run_dir / "summary.json").read_text())
    assert stopped["stop_reason"] == "SIGTERM" and stopped["accuracy_after"] is None
    steps_done = len(read_jsonl(run_dir / "metrics.jsonl"))
    assert 3 <= steps_done < STEPS and stopped["steps"] == steps_done
    assert list_checkpoints(run_dir)[-1].name == f"step-{steps_done:08d}"  # the stop saved one
    summary = _resume(run_dir, tmp_path / "resume.log")
    assert summary["steps"] == STEPS and summary["resumes"] == 1 and summary["stop_reason"] is None
    check_ledger(run_dir)
