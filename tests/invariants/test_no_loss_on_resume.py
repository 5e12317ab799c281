"""Invariant 7 (DESIGN §4): nothing is lost, nothing is trained twice, across a kill and a resume.

A real ``asyncrl train`` process (tiny random-init model, small batches) is killed with SIGKILL
at a random moment (after a random number of training steps plus a random delay, so the kill
lands in generation, training, weight sync or a checkpoint save), then ``asyncrl train --resume``
finishes it. The ledger alone must then show: every prompt of the stream admitted once in order
(no gap in the data position), every admitted prompt with exactly one fate, no sample trained
twice, every step trained once with a full batch, and no trained sample past the staleness
bound; a kill before the first checkpoint leaves nothing to resume from, and there the resume must
refuse in one line and change nothing (the checks live in ``asyncrl.controller.ledger_checks``: the chaos soak,
``scripts/chaos_soak.py``, runs the same ones after each of its many kills). A second test stops
a run with SIGTERM (graceful: checkpoint, exit status 143) and resumes it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from asyncrl.controller import ledger_checks
from asyncrl.controller.ledger_checks import LedgerLimits
from asyncrl.controller.resume import list_checkpoints
from asyncrl.controller.rundir import read_jsonl

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


HANG_GUARD_S = 1800.0
"""Seconds after which a child run counts as hung: a guard against a test that never ends, far past what a loaded
2-core machine needs (these tests assert events and the ledger, never how fast a run goes)."""


def _wait_for_steps(proc: subprocess.Popen, metrics: Path, steps: int) -> None:
    """Until ``steps`` lines are in ``metrics``, however slow the machine; the run must not exit first."""
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        if metrics.is_file() and len(read_jsonl(metrics)) >= steps:
            return
        assert proc.poll() is None, f"training exited early with {proc.returncode}"
        time.sleep(0.02)
    raise AssertionError(f"no {steps} training steps within {HANG_GUARD_S} s: the run hangs")


def _run_resume(run_dir: Path, log: Path) -> int:
    """``asyncrl train --resume run_dir``, its output in ``log``; its exit status."""
    with open(log, "w") as out:
        return subprocess.run(
            _asyncrl("train", "--resume", str(run_dir)), stdout=out, stderr=subprocess.STDOUT, timeout=HANG_GUARD_S
        ).returncode


def _resume(run_dir: Path, log: Path) -> dict:
    rc = _run_resume(run_dir, log)
    assert rc == 0, log.read_text()[-3000:]
    return json.loads((run_dir / "summary.json").read_text())


def check_ledger(run_dir: Path) -> dict[str, int]:
    """Assert the invariants on the ledger and metrics of a finished run of ``STEPS`` steps (the
    checks are ``asyncrl.controller.ledger_checks``, shared with the chaos soak); return some counts."""
    limits = LedgerLimits(batch_size=BATCH, group_size=GROUP, max_staleness=ETA)
    report = ledger_checks.check_ledger(run_dir, limits, ended=True, total_steps=STEPS).require()
    return {"admitted": report.admitted, "readmitted": report.readmitted, "trained": report.trained}


def test_sigkill_at_a_random_moment_then_resume(tiny_policy_dir: Path, tmp_path: Path) -> None:
    seed = int(os.environ.get("ASYNCRL_KILL_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    run_dir = tmp_path / "run"
    log = tmp_path / "first.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            _asyncrl("train", "--run-dir", str(run_dir), *_args(tiny_policy_dir)), stdout=out, stderr=subprocess.STDOUT
        )
        try:
            _wait_for_steps(proc, run_dir / "metrics.jsonl", rng.randint(1, STEPS - 4))
            time.sleep(rng.uniform(0.0, 0.5))
            assert proc.poll() is None, "the run ended before the kill"
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=10) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
    killed_at = len(read_jsonl(run_dir / "metrics.jsonl"))
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        # killed before the first checkpoint: the trained steps' weights are gone, and starting over would
        # replace their metrics, so the resume refuses in one line and changes nothing
        _resume_refused_before_the_first_checkpoint(run_dir, tmp_path / "resume.log", seed, killed_at)
        return
    summary = _resume(run_dir, tmp_path / "resume.log")
    counts = check_ledger(run_dir)
    note = f"seed={seed} killed after {killed_at} steps, checkpoints {[p.name for p in ckpts]}, {counts}"
    assert summary["steps"] == STEPS and summary["max_staleness_seen"] <= ETA, note
    assert summary["resumes"] == 1, note
    if ckpts[-1].name != f"step-{STEPS:08d}":
        # prompts in flight (or waiting) at a mid-run checkpoint were admitted again; a kill that lands after the
        # last step's checkpoint (during the final evaluation) leaves nothing to train, so nothing is readmitted
        assert counts["readmitted"] > 0, note
    assert summary["accuracy_after"] is not None


def _resume_refused_before_the_first_checkpoint(run_dir: Path, log: Path, seed: int, killed_at: int) -> None:
    metrics_before = (run_dir / "metrics.jsonl").read_bytes()
    rc = _run_resume(run_dir, log)
    text = log.read_text()
    note = f"seed={seed} killed after {killed_at} steps, no checkpoint: {text[-2000:]}"
    assert rc == 2 and "it has no checkpoint to resume from" in text, note
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics_before, note
    assert not list_checkpoints(run_dir), note


def test_sigterm_stops_gracefully_with_a_checkpoint(tiny_policy_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    log = tmp_path / "first.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            _asyncrl("train", "--run-dir", str(run_dir), *_args(tiny_policy_dir)), stdout=out, stderr=subprocess.STDOUT
        )
        try:
            _wait_for_steps(proc, run_dir / "metrics.jsonl", 3)
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=HANG_GUARD_S)  # the stop finishes its step and writes a checkpoint
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
