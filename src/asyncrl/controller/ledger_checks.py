"""Invariant 7 read from a run directory: nothing lost, nothing trained twice, no staleness bound broken.

Owns ``check_ledger``, the one implementation of the ledger checks that the invariant test
(``tests/invariants/test_no_loss_on_resume.py``), the scripted loop tests and the chaos soak
(``scripts/chaos_soak.py``) share. It reads only ``trajectories.jsonl`` (the ledger),
``metrics.jsonl`` and, for the limits, ``config.yaml``, and returns a ``LedgerReport``:

- the data position: first admissions follow the prompt stream in order, without gaps or repeats;
  a re-admitted prompt is one admitted before, under the same stream index;
- every ``resumed`` marker re-admits exactly what was admitted and had no fate at that point
  (its ``readmit`` count), and nothing else;
- the staleness budget, replayed in ledger order: at every admission at version v, the groups
  admitted and not given back fit ``(η + v + 1) * batch_size``, η the one in force for that admission
  (its line's ``max_staleness`` under ``controller.adaptive``, never above the config's; else the config's);
- every admitted prompt has one fate (status), its samples each once, after its last admission.
  A run that ended (finished or stopped) must have a fate for every prompt; a killed one may have
  prompts in flight (admitted after its last resume) or waiting to be re-admitted;
- no (prompt, sample) trained twice; ``trained_step - min_version <= η`` of its last admission;
- every training step once, in order, in ``metrics.jsonl``, each with ``batch_size`` groups of
  ``group_size`` samples (trained, or skipped by a non-finite step). In a killed run the ledger may
  hold part of the one step whose metrics line the kill prevented. A group whose lines carry
  ``group_samples`` (episodes of several samples each, ``Group.episodes``) has that many samples instead.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from asyncrl.controller.run_claim import MixedRunDir, check_one_run, read_jsonl
from asyncrl.controller.staleness import group_bound

Line = dict[str, Any]
_NO_FATE = ("admitted", "resumed")


class LedgerViolation(AssertionError):
    """The ledger breaks invariant 7 (the message lists every finding)."""


@dataclass(frozen=True)
class LedgerLimits:
    """The run's settings the checks depend on."""

    batch_size: int
    """Groups per training step (``controller.batch_size``)."""
    group_size: int
    """Samples per prompt (``rollout.group_size``)."""
    max_staleness: int
    """η (``controller.max_staleness``)."""

    @classmethod
    def of_run(cls, run_dir: str | Path) -> LedgerLimits:
        """The limits from the run's saved ``config.yaml``."""
        cfg = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
        c = cfg["controller"]
        return cls(int(c["batch_size"]), int(cfg["rollout"]["group_size"]), int(c["max_staleness"]))


@dataclass
class LedgerReport:
    """What ``check_ledger`` found; ``ok`` when every list of findings is empty."""

    admitted: int = 0
    """Prompts admitted for the first time."""
    readmitted: int = 0
    """Admissions of prompts again after a resume."""
    trained: int = 0
    """Samples trained."""
    steps: int = 0
    """Training steps in ``metrics.jsonl``."""
    resumes: int = 0
    """``resumed`` markers in the ledger."""
    open_prompts: int = 0
    """Admitted prompts with no fate yet (in flight or waiting to be re-admitted: a killed run only)."""
    lost: list[str] = field(default_factory=list)
    """Prompts admitted and then neither given a fate nor re-admitted when they should have been."""
    trained_twice: list[str] = field(default_factory=list)
    over_bound: list[str] = field(default_factory=list)
    """Trained samples past the staleness bound, and admissions past the staleness budget."""
    problems: list[str] = field(default_factory=list)
    """Everything else: order, several fates, steps missing or repeated, mixed runs."""

    @property
    def ok(self) -> bool:
        return not (self.lost or self.trained_twice or self.over_bound or self.problems)

    def require(self) -> LedgerReport:
        """Raise ``LedgerViolation`` naming the first findings of each kind unless ``ok``; returns self."""
        if not self.ok:
            parts = [
                f"{name} ({len(found)}): {found[:5]}"
                for name, found in (
                    ("lost", self.lost),
                    ("trained twice", self.trained_twice),
                    ("over the staleness bound", self.over_bound),
                    ("other", self.problems),
                )
                if found
            ]
            raise LedgerViolation("; ".join(parts))
        return self

    def counts(self) -> dict[str, int]:
        """The numbers of the report (for a JSON summary)."""
        return {
            "admitted": self.admitted,
            "readmitted": self.readmitted,
            "trained_samples": self.trained,
            "steps": self.steps,
            "resumes": self.resumes,
            "open_prompts": self.open_prompts,
            "lost": len(self.lost),
            "trained_twice": len(self.trained_twice),
            "over_bound": len(self.over_bound),
            "other_problems": len(self.problems),
        }


def check_ledger(
    run_dir: str | Path, limits: LedgerLimits | None = None, *, ended: bool = True, total_steps: int | None = None
) -> LedgerReport:
    """Check the ledger of ``run_dir`` (see the module docstring). ``ended``: the run finished or
    stopped (every admitted prompt must have a fate); False for a run that was killed (or is
    running). ``total_steps``: the steps the run must have trained (None: any number)."""
    run = Path(run_dir)
    limits = limits or LedgerLimits.of_run(run)
    report = LedgerReport()
    try:
        check_one_run(run)
    except MixedRunDir as exc:
        report.problems.append(str(exc))
    ledger = read_jsonl(run / "trajectories.jsonl")
    metrics = read_jsonl(run / "metrics.jsonl")
    report.resumes = sum(r["status"] == "resumed" for r in ledger)
    _check_stream(ledger, report)
    _check_resumes(ledger, report)
    _check_admission_budget(ledger, limits, report)
    _check_fates(ledger, limits, ended, report)
    _check_training(ledger, metrics, limits, ended, total_steps, report)
    return report


def _check_stream(ledger: list[Line], report: LedgerReport) -> None:
    """First admissions in stream order; re-admissions only of prompts admitted before."""
    index_of: dict[str, int] = {}
    for r in ledger:
        if r["status"] != "admitted":
            continue
        if r["readmitted"]:
            report.readmitted += 1
            if index_of.get(r["prompt_id"]) != r["stream_index"]:
                report.problems.append(f"re-admitted a prompt not admitted before under that index: {r}")
            continue
        if r["prompt_id"] in index_of:
            report.problems.append(f"prompt {r['prompt_id']} admitted twice as new")
        elif r["stream_index"] != len(index_of):
            report.problems.append(f"data position: stream index {r['stream_index']} admitted after {len(index_of)}")
        index_of[r["prompt_id"]] = r["stream_index"]
    report.admitted = len(index_of)


def _check_resumes(ledger: list[Line], report: LedgerReport) -> None:
    """Each ``resumed`` marker re-admits exactly the prompts admitted before it without a fate."""
    open_ids: set[str] = set()
    pending: set[str] | None = None  # the prompts the last marker promised to re-admit
    for r in ledger:
        match r["status"]:
            case "admitted":
                if r["readmitted"]:
                    if pending is None or r["prompt_id"] not in pending:
                        report.problems.append(f"re-admitted {r['prompt_id']}, not open at the resume")
                    else:
                        pending.discard(r["prompt_id"])
                open_ids.add(r["prompt_id"])
            case "resumed":
                if len(open_ids) != r["readmit"]:
                    report.lost.append(
                        f"resume at step {r['step']}: {len(open_ids)} prompts open, {r['readmit']} to re-admit"
                    )
                pending = set(open_ids)
            case _:
                open_ids.discard(r["prompt_id"])


def _check_admission_budget(ledger: list[Line], limits: LedgerLimits, report: LedgerReport) -> None:
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
                eta = _admitted_bound(r, limits, report)
                if live > (eta + r["start_version"] + 1) * limits.batch_size:
                    report.over_bound.append(f"admission past the staleness budget ({live} groups live): {r}")
            case "resumed":
                live = counted_groups
            case "filtered" | "stale" if r["sample_idx"] == 0:
                live -= 1
            case "engine_failure":
                live -= 1
            case "trained" | "skipped" if r["sample_idx"] == 0:
                counted_groups += 1


def _admitted_bound(admitted: Line, limits: LedgerLimits, report: LedgerReport) -> int:
    """The η in force for an admission: its line's (adaptive admission), else the config's."""
    eta = admitted.get("max_staleness")
    if eta is None:
        return limits.max_staleness
    if eta > limits.max_staleness:
        report.over_bound.append(f"admitted under η = {eta}, above the bound {limits.max_staleness}: {admitted}")
    return min(int(eta), limits.max_staleness)


def _check_fates(ledger: list[Line], limits: LedgerLimits, ended: bool, report: LedgerReport) -> None:
    """One fate per admitted prompt, after its last admission, each sample once."""
    last_admission: dict[str, int] = {}
    fates: dict[str, list[tuple[int, Line]]] = defaultdict(list)
    for pos, r in enumerate(ledger):
        if r["status"] == "admitted":
            last_admission[r["prompt_id"]] = pos
        elif r["status"] not in _NO_FATE:
            fates[r["prompt_id"]].append((pos, r))
    for pid in set(fates) - set(last_admission):
        report.problems.append(f"a fate for prompt {pid}, never admitted")
    for pid, admitted_at in last_admission.items():
        lines = fates.get(pid)
        if not lines:
            if ended:
                report.lost.append(f"prompt {pid} admitted and lost: no fate in the ledger")
            else:
                report.open_prompts += 1
            continue
        if lines[0][0] < admitted_at:
            report.problems.append(f"prompt {pid} re-admitted after its fate")
        statuses = {r["status"] for _, r in lines}
        if len(statuses) > 1:
            report.problems.append(f"prompt {pid} has several fates: {sorted(statuses)}")
        samples = sorted(r["sample_idx"] for _, r in lines if r["sample_idx"] is not None)
        whole = list(range(_group_samples([r for _, r in lines], limits)))
        if lines[0][1]["sample_idx"] is None:
            if len(lines) != 1 or not statuses <= {"in_flight", "engine_failure"}:
                report.problems.append(f"prompt {pid}: a prompt-level fate beside others: {sorted(statuses)}")
        elif samples != whole and (ended or len(samples) != len(set(samples)) or not set(samples) <= set(whole)):
            report.problems.append(f"prompt {pid}: samples {samples}, expected {whole}")


def _check_training(
    ledger: list[Line],
    metrics: list[Line],
    limits: LedgerLimits,
    ended: bool,
    total_steps: int | None,
    report: LedgerReport,
) -> None:
    """No sample trained twice or past the bound; every step once with a full batch."""
    trained = [r for r in ledger if r["status"] == "trained"]
    bound_of = {r["prompt_id"]: r.get("max_staleness") for r in ledger if r["status"] == "admitted"}  # the last
    report.trained = len(trained)
    twice = [k for k, n in Counter((r["prompt_id"], r["sample_idx"]) for r in trained).items() if n > 1]
    report.trained_twice.extend(f"{pid} sample {idx}" for pid, idx in twice)
    for r in trained:
        bound = group_bound(bound_of.get(r["prompt_id"]), limits.max_staleness)
        if r["trained_step"] - r["min_version"] > bound:
            report.over_bound.append(f"trained {r['trained_step'] - r['min_version']} versions stale (η {bound}): {r}")
        if not r["min_version"] <= r["max_version"] <= r["trained_step"]:
            report.problems.append(f"versions out of order: {r}")
    steps = [m["step"] for m in metrics]
    report.steps = len(steps)
    if steps != list(range(len(steps))):
        report.problems.append(f"metrics.jsonl steps are not 0..{len(steps) - 1} once each")
    if total_steps is not None and len(steps) != total_steps:
        report.problems.append(f"{len(steps)} training steps, {total_steps} expected")
    skipped = [r for r in ledger if r["status"] == "skipped"]
    per_step = Counter(r["trained_step"] for r in trained)
    per_step.update(r["step"] for r in skipped)
    sizes_at: dict[int, list[int]] = defaultdict(list)  # per step: each group's samples (group_samples, else G)
    for r in [*trained, *skipped]:
        if r["sample_idx"] == 0:
            sizes_at[r["trained_step"] if r["status"] == "trained" else r["step"]].append(_group_samples([r], limits))
    for step in sorted(set(per_step) | set(range(len(steps)))):
        n = per_step.get(step, 0)
        sizes = sizes_at.get(step, [])
        full = sum(sizes) if len(sizes) == limits.batch_size else limits.batch_size * limits.group_size
        partial_ok = not ended and step == len(steps) and n <= full  # killed while logging this step
        if n != full and not partial_ok:
            report.problems.append(f"step {step}: {n} samples in the ledger, {full} expected")


def _group_samples(lines: list[Line], limits: LedgerLimits) -> int:
    """A group's samples: its lines' ``group_samples`` (episodes of several samples), else ``group_size``."""
    sizes = {r["group_samples"] for r in lines if r.get("group_samples") is not None}
    return sizes.pop() if len(sizes) == 1 else limits.group_size
