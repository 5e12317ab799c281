"""Chaos soak (issue 14, item 3): train for a long time while a killer SIGKILLs parts of the run at
random moments, resume after every kill, and check the ledger each time.

What it does, on a tiny random-init policy built locally (no download):

- ``asyncrl train`` with a large ``controller.total_steps``, the trainer in its own process
  (``controller.trainer_process=true``) and the ``math`` verifier, so that rewards are computed in
  reward worker processes (``reward.num_workers=2``);
- repeatedly, at a random moment (after a random number of new training steps plus a random delay,
  or now and then during start-up and restore), SIGKILL one of: the whole run (the main process;
  its children must go with it), the trainer process (a child: the run must stop, not hang), or a
  reward worker (a child: the run must carry on, the service replaces the worker). Under the local
  launcher the engine is a thread of the main process, so killing the run is killing the engine;
- after every kill that ends the run, check the ledger (``asyncrl.controller.ledger_checks``, the
  checks of the invariant test): nothing lost, nothing trained twice, no admission or trained
  sample past the staleness bound, every step once; and check that every checkpoint still verifies
  (a kill during a save must never leave a checkpoint that looks complete). Then
  ``asyncrl train --resume``;
- once, before a resume (a third of the way in, when two checkpoints exist), damage the newest
  checkpoint (truncate the weights, flip bytes of the trainer state, or delete the manifest) and
  check that the resume names it, sets it aside and restores the previous one;
- at the end, stop the run with SIGTERM (graceful: checkpoint, exit 143), check the ledger of the
  ended run (every admitted prompt with a fate), and write a JSON summary (``--json``).

Exit status 0 when every check held. The soak phase lasts ``--minutes``; the final stop adds up
to a few minutes. ``python scripts/chaos_soak.py --minutes 10 --json docs/results/chaos_soak.json``
made the committed result (docs/controller.md, "Chaos soak").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.controller.ledger_checks import LedgerLimits, LedgerReport, check_ledger
from asyncrl.controller.resume import CHECKPOINTS, CORRUPT, list_checkpoints, verify_checkpoint
from asyncrl.controller.rundir import read_jsonl
from asyncrl.models import build_tiny_policy
from asyncrl.trainer.checkpoint import MANIFEST, TRAINER_STATE

SETTINGS = {
    "controller.max_staleness": 2,
    "controller.total_steps": 1_000_000,
    "controller.batch_size": 4,
    "controller.max_concurrent": 12,
    "controller.checkpoint_every": 2,
    "controller.trainer_process": "true",
    "rollout.group_size": 4,
    "rollout.max_new_tokens": 24,
    "rollout.max_slots": 32,
    "eval.max_new_tokens": 16,
    "task.eval_size": 4,
    "task.train_size": 300,
    "task.verifier": "math",
    "reward.num_workers": 2,
    "algo.filter_equal_rewards": "false",
    "run.progress": "false",
}
LIMITS = LedgerLimits(
    batch_size=int(SETTINGS["controller.batch_size"]),
    group_size=int(SETTINGS["rollout.group_size"]),
    max_staleness=int(SETTINGS["controller.max_staleness"]),
)
KILL_KINDS = {"run": 0.4, "trainer": 0.35, "reward_worker": 0.25}
STARTUP_KILL_P = 0.2
"""Share of kills aimed at start-up and restore (a random moment in the first seconds)."""
EXIT_TIMEOUT_S = 90.0
"""How long a run may take to exit after its trainer was killed, or after SIGTERM (x2)."""
STEP_TIMEOUT_S = 240.0
"""How long the soak waits for a training step before it calls the run stuck."""


def asyncrl(*argv: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from asyncrl.cli import main; sys.exit(main())", *argv]


# ------------------------------------------------------------------------------------- processes


def children(pid: int) -> dict[int, str]:
    """Live child processes of ``pid`` (pid -> command line), read from /proc."""
    out: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                out[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def trainer_pid(pid: int) -> int | None:
    """The trainer process of run ``pid``: its multiprocessing-spawned child."""
    found = [p for p, cmd in children(pid).items() if "spawn_main" in cmd]
    return found[0] if found else None


def reward_pids(pid: int) -> list[int]:
    return sorted(p for p, cmd in children(pid).items() if "asyncrl.reward.worker" in cmd)


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ------------------------------------------------------------------------------------- the soak


@dataclass
class Soak:
    run_dir: Path
    model_dir: Path
    log_dir: Path
    rng: random.Random
    deadline: float
    corrupt_after: float
    kills: Counter[str] = field(default_factory=Counter)
    startup_kills: int = 0
    resumes: int = 0
    checks: list[dict[str, Any]] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    orphans: int = 0
    corruption: dict[str, Any] = field(default_factory=lambda: {"done": False})
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    starts: int = 0
    t0: float = field(default_factory=time.monotonic)

    # ---------------------------------------------------------------- starting and waiting
    def start(self, resume: bool) -> None:
        self.starts += 1
        self.log = self.log_dir / f"start-{self.starts:03d}.log"
        if resume:
            argv = asyncrl("train", "--resume", str(self.run_dir))
            self.resumes += 1
        else:
            sets = [a for k, v in {"model.path": self.model_dir, **SETTINGS}.items() for a in ("--set", f"{k}={v}")]
            argv = asyncrl("train", "--run-dir", str(self.run_dir), *sets)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def steps(self) -> int:
        return len(read_jsonl(self.run_dir / "metrics.jsonl"))

    def wait_for_steps(self, target: int, *, until_deadline: bool = True) -> bool:
        """Until ``metrics.jsonl`` holds ``target`` steps (True); False when the run exited, the
        deadline passed or no step came in ``STEP_TIMEOUT_S`` (a finding)."""
        assert self.proc is not None
        last, last_t = -1, time.monotonic()
        while True:
            if self.proc.poll() is not None:
                return False
            n = self.steps()
            if n >= target:
                return True
            if n != last:
                last, last_t = n, time.monotonic()
            if until_deadline and time.monotonic() > self.deadline:
                return False
            if time.monotonic() - last_t > STEP_TIMEOUT_S:
                self.findings.append(f"start {self.starts}: no training step for {STEP_TIMEOUT_S:.0f}s (stuck)")
                return False
            time.sleep(0.25)

    def wait_for_text(self, pattern: str, timeout: float) -> re.Match[str] | None:
        """The first match of ``pattern`` in the current log (None: the run exited or the time ran out)."""
        assert self.proc is not None and self.log is not None
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = re.search(pattern, self.log.read_text(errors="replace"))
            if found or self.proc.poll() is not None:
                return found or re.search(pattern, self.log.read_text(errors="replace"))
            time.sleep(0.25)
        return None

    def log_tail(self, n: int = 1500) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log is not None else ""

    # ---------------------------------------------------------------- killing
    def kill_something(self, kind: str | None = None) -> str:
        """SIGKILL one part of the running run (``kind``, or one chosen at random among those that
        exist now); returns the kind. The run (and all its children) is gone afterwards unless a
        reward worker was the target."""
        assert self.proc is not None
        pid = self.proc.pid
        if kind is None:
            kinds = [
                k
                for k in KILL_KINDS
                if k == "run" or (k == "trainer" and trainer_pid(pid)) or (k == "reward_worker" and reward_pids(pid))
            ]
            kind = self.rng.choices(kinds, weights=[KILL_KINDS[k] for k in kinds])[0]
        self.kills[kind] += 1
        family = children(pid)
        if kind == "reward_worker":
            kill(self.rng.choice(reward_pids(pid)))
            return kind
        tpid = trainer_pid(pid)
        if kind == "trainer" and tpid is not None:
            kill(tpid)
            try:
                self.proc.wait(timeout=EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.findings.append(
                    f"start {self.starts}: the run did not exit {EXIT_TIMEOUT_S:.0f}s after its "
                    "trainer was killed (hang); killed it"
                )
        kill(pid)
        self.proc.wait()
        self.reap(family)
        return kind

    def reap(self, family: dict[int, str]) -> None:
        """The run's children must exit with it (pipe EOF, parent-death signal); count and kill any left."""
        end = time.monotonic() + 20.0
        while time.monotonic() < end and any(alive(p) for p in family):
            time.sleep(0.2)
        for p, cmd in family.items():
            if alive(p):
                self.orphans += 1
                self.findings.append(f"start {self.starts}: child {p} outlived its run: {cmd[:120]}")
                kill(p)

    # ---------------------------------------------------------------- checking
    def check(self, *, ended: bool, after: str) -> LedgerReport:
        report = check_ledger(self.run_dir, LIMITS, ended=ended)
        bad = {p.name: why for p in list_checkpoints(self.run_dir) if (why := verify_checkpoint(p))}
        entry = {
            "t_s": round(time.monotonic() - self.t0, 1),
            "after": after,
            **report.counts(),
            "checkpoints_failing": len(bad),
        }
        self.checks.append(entry)
        if not report.ok:
            self.findings.append(
                f"ledger after {after}: {report.lost[:3]} {report.trained_twice[:3]} "
                f"{report.over_bound[:3]} {report.problems[:3]}"
            )
        if bad:
            self.findings.append(f"after {after}: checkpoints that do not verify: {bad}")
        return report

    # ---------------------------------------------------------------- corruption
    def maybe_corrupt(self, *, now: bool = False) -> bool:
        """Damage the newest checkpoint once (a third of the way in, or ``now``; two good
        checkpoints needed); True if done."""
        if self.corruption["done"] or (time.monotonic() < self.corrupt_after and not now):
            return False
        found = list_checkpoints(self.run_dir)
        if len(found) < 2 or any(verify_checkpoint(p) for p in found[-2:]):
            if now:
                self.findings.append(f"could not damage a checkpoint: {[p.name for p in found]} (two good needed)")
            return False
        newest, previous = found[-1], found[-2]
        how = self.rng.choice(["truncate_weights", "flip_state_bytes", "delete_manifest"])
        if how == "truncate_weights":
            weights = newest / "model.safetensors"
            os.truncate(weights, weights.stat().st_size // 2)
        elif how == "flip_state_bytes":
            state = newest / TRAINER_STATE
            data = bytearray(state.read_bytes())
            at = self.rng.randrange(len(data) - 16)
            data[at : at + 16] = bytes(b ^ 0xFF for b in data[at : at + 16])
            state.write_bytes(bytes(data))
        else:
            (newest / MANIFEST).unlink()
        self.corruption = {
            "done": True,
            "checkpoint": newest.name,
            "how": how,
            "expected_restore": previous.name,
            "path": str(newest),
        }
        return True

    def check_corrupt_resume(self) -> None:
        """The resume just started after ``maybe_corrupt``: it must name the damaged checkpoint,
        set it aside and restore the previous one."""
        c = self.corruption
        restored = self.wait_for_text(r"resuming \S+ from (step-\d+)", timeout=STEP_TIMEOUT_S)
        text = self.log.read_text(errors="replace") if self.log is not None else ""
        message = next((line for line in text.splitlines() if "is damaged" in line), None)
        set_aside = sorted(p.name for p in (self.run_dir / CHECKPOINTS / CORRUPT).glob(f"{c['checkpoint']}.*"))
        c.update(message=message, restored=restored.group(1) if restored else None, set_aside=set_aside)
        c["detected"] = bool(message and c["path"] in message and c["restored"] == c["expected_restore"] and set_aside)
        if not c["detected"]:
            self.findings.append(f"damaged checkpoint not handled as expected: {c}; log: {self.log_tail()}")


def one_cycle(soak: Soak) -> None:
    """Start (or resume) the run, kill parts of it at random moments until it is gone, check the ledger."""
    first = soak.starts == 0
    corrupted = not first and soak.maybe_corrupt()
    soak.start(resume=not first)
    if corrupted:
        soak.check_corrupt_resume()
    fresh = not (first or corrupted)  # may be killed while starting or restoring
    while True:
        if fresh and soak.rng.random() < STARTUP_KILL_P:
            time.sleep(soak.rng.uniform(0.0, 10.0))  # start-up, restore, the first steps
            soak.startup_kills += 1
        else:
            found = list_checkpoints(soak.run_dir)
            base = max(soak.steps(), int(found[-1].name.split("-")[1]) if found else 0)
            if not soak.wait_for_steps(base + soak.rng.randint(1, 5)):
                break
            time.sleep(soak.rng.uniform(0.0, 2.0))
        fresh = False
        if soak.proc is None or soak.proc.poll() is not None or time.monotonic() > soak.deadline:
            break
        kind = soak.kill_something()
        if kind != "reward_worker":
            soak.check(ended=False, after=f"{kind} kill")
            return
    if soak.proc is not None and soak.proc.poll() is not None:  # it ended without a kill
        soak.findings.append(
            f"start {soak.starts} exited by itself (rc {soak.proc.returncode}, kills so far "
            f"{dict(soak.kills)}): {soak.log_tail()}"
        )
        soak.check(ended=False, after="an unexpected exit")


def finish(soak: Soak) -> LedgerReport:
    """Damage a checkpoint now if that has not happened yet (the run is killed first), resume if the
    run is not running, then stop it gracefully (SIGTERM after one new step) and check the ended run."""
    running = soak.proc is not None and soak.proc.poll() is None
    if not soak.corruption["done"]:  # a short soak: two checkpoints, a kill, the damage, a resume
        if not running:
            soak.start(resume=soak.starts > 0)
        soak.wait_for_steps(2 * int(SETTINGS["controller.checkpoint_every"]) + 1, until_deadline=False)
        soak.kill_something("run")
        soak.check(ended=False, after="run kill")
        corrupted = soak.maybe_corrupt(now=True)
        soak.start(resume=True)
        if corrupted:
            soak.check_corrupt_resume()
    elif not running:
        soak.start(resume=True)
    soak.wait_for_steps(soak.steps() + 1, until_deadline=False)
    assert soak.proc is not None
    if soak.proc.poll() is None:
        soak.proc.send_signal(signal.SIGTERM)
        try:
            rc = soak.proc.wait(timeout=2 * EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            soak.findings.append("the final SIGTERM did not stop the run; killed it")
            kill(soak.proc.pid)
            rc = soak.proc.wait()
        if rc != 128 + signal.SIGTERM:
            soak.findings.append(f"the final SIGTERM ended the run with {rc}: {soak.log_tail()}")
    else:
        soak.findings.append(f"the final run exited by itself (rc {soak.proc.returncode}): {soak.log_tail()}")
    return soak.check(ended=True, after="the final SIGTERM")


def summarize(soak: Soak, final: LedgerReport, args: argparse.Namespace, wall_s: float) -> dict[str, Any]:
    worst = {k: max(c[k] for c in soak.checks) for k in ("lost", "trained_twice", "over_bound", "other_problems")}
    path = soak.run_dir / "summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else {}
    repo = Path(__file__).resolve().parents[1]
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    return {
        "command": "python scripts/chaos_soak.py " + " ".join(sys.argv[1:]),
        "git_commit": commit.strip() or None,
        "minutes": args.minutes,
        "seed": args.seed,
        "settings": SETTINGS,
        "wall_s": round(wall_s, 1),
        "kills": dict(soak.kills),
        "kills_total": sum(soak.kills.values()),
        "kills_during_startup_or_restore": soak.startup_kills,
        "resumes": soak.resumes,
        "ledger_checks": len(soak.checks),
        "steps_trained": final.steps,
        "samples_trained": final.trained,
        "prompts_admitted": final.admitted,
        "prompts_readmitted": final.readmitted,
        "max_staleness_seen": summary.get("max_staleness_seen"),
        "lost": worst["lost"],
        "trained_twice": worst["trained_twice"],
        "over_bound": worst["over_bound"],
        "other_problems": worst["other_problems"],
        "checkpoints_failing_verification": max(c["checkpoints_failing"] for c in soak.checks),
        "orphan_processes": soak.orphans,
        "corruption": soak.corruption,
        "findings": soak.findings,
        "ok": not soak.findings and soak.corruption.get("detected", False) and final.ok,
        "checks": soak.checks,
        "engine_note": "local launcher: the engine is a thread of the main process; a 'run' kill kills it",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="length of the kill phase (default 30)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the killer (default: random, printed)")
    parser.add_argument("--run-dir", type=Path, default=None, help="a new directory (default runs/chaos-<time>)")
    parser.add_argument("--json", type=Path, default=None, help="write the summary here")
    args = parser.parse_args(argv)
    args.seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    run_dir = args.run_dir or Path("runs") / time.strftime("chaos-%Y%m%d-%H%M%S")
    if run_dir.exists() and any(run_dir.iterdir()):
        parser.error(f"{run_dir} is not empty: the soak needs a new run directory")
    log_dir = run_dir.with_name(run_dir.name + "-logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    model_dir = Path(tempfile.mkdtemp(prefix="chaos-model-"))
    t0 = time.monotonic()
    print(f"chaos soak: {args.minutes} min, seed {args.seed}, run {run_dir}, logs {log_dir}", flush=True)
    soak = Soak(
        run_dir,
        build_tiny_policy(model_dir),
        log_dir,
        random.Random(args.seed),
        deadline=t0 + 60 * args.minutes,
        corrupt_after=t0 + 20 * args.minutes,
    )
    try:
        while time.monotonic() < soak.deadline:
            one_cycle(soak)
            last = soak.checks[-1] if soak.checks else {}
            print(
                f"[{time.monotonic() - t0:6.0f}s] kills {dict(soak.kills)} resumes {soak.resumes} "
                f"steps {last.get('steps')} lost {last.get('lost')} twice {last.get('trained_twice')} "
                f"over {last.get('over_bound')}",
                flush=True,
            )
        final = finish(soak)
    finally:
        if soak.proc is not None and soak.proc.poll() is None:
            family = children(soak.proc.pid)
            kill(soak.proc.pid)
            soak.proc.wait()
            soak.reap(family)
        shutil.rmtree(model_dir, ignore_errors=True)
    out = summarize(soak, final, args, time.monotonic() - t0)
    print(json.dumps({k: v for k, v in out.items() if k != "checks"}, indent=1))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
