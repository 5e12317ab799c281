"""The ledger checks (``controller.ledger_checks``) on hand-written ledgers: a good one passes, and
each broken invariant is found (so that the invariant test and the chaos soak can fail)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncrl.controller.ledger_checks import LedgerLimits, LedgerViolation, check_ledger

LIMITS = LedgerLimits(batch_size=1, group_size=2, max_staleness=1)


def _admit(pid: str, index: int, version: int, readmitted: bool = False) -> dict[str, Any]:
    return {
        "prompt_id": pid,
        "sample_idx": None,
        "status": "admitted",
        "stream_index": index,
        "start_version": version,
        "readmitted": readmitted,
    }


def _trained(pid: str, step: int, version: int) -> list[dict[str, Any]]:
    return [
        {
            "prompt_id": pid,
            "sample_idx": i,
            "status": "trained",
            "min_version": version,
            "max_version": version,
            "trained_step": step,
        }
        for i in range(2)
    ]


def _good() -> list[dict[str, Any]]:
    """Two steps of one group of two; p2 is in flight when the run ends."""
    return [
        _admit("p0", 0, 0),
        _admit("p1", 1, 0),
        *_trained("p0", 0, 0),
        _admit("p2", 2, 1),
        *_trained("p1", 1, 0),
        {"prompt_id": "p2", "sample_idx": None, "status": "in_flight", "start_version": 1},
    ]


def _write(run: Path, ledger: list[dict[str, Any]], steps: int = 2) -> Path:
    run.mkdir(exist_ok=True)
    (run / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ledger))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(steps)))
    return run


def test_a_good_ledger_passes(tmp_path: Path) -> None:
    report = check_ledger(_write(tmp_path, _good()), LIMITS, total_steps=2).require()
    assert (report.admitted, report.trained, report.steps, report.open_prompts) == (3, 4, 2, 0)


def test_each_broken_invariant_is_found(tmp_path: Path) -> None:
    twice = _good() + _trained("p0", 1, 0)[:1]
    assert check_ledger(_write(tmp_path / "a", twice), LIMITS).trained_twice == ["p0 sample 0"]
    stale = _good()
    stale[5:7] = _trained("p1", 1, -1)  # trained 2 versions after it was generated, η = 1
    assert len(check_ledger(_write(tmp_path / "b", stale), LIMITS).over_bound) == 2
    lost = _good()[:-1]  # p2 never gets a fate
    assert len(check_ledger(_write(tmp_path / "c", lost), LIMITS).lost) == 1
    killed = check_ledger(tmp_path / "c", LIMITS, ended=False).require()  # killed: p2 was in flight
    assert killed.open_prompts == 1
    gap = [_admit("p0", 0, 0), _admit("p1", 2, 0)]
    assert "stream index 2" in check_ledger(_write(tmp_path / "d", gap, 0), LIMITS, ended=False).problems[0]
    over = [_admit(f"p{i}", i, 0) for i in range(3)]  # (η + 0 + 1) * B = 2 groups at version 0
    assert len(check_ledger(_write(tmp_path / "e", over, 0), LIMITS, ended=False).over_bound) == 1
    missing = check_ledger(_write(tmp_path / "f", _good(), steps=3), LIMITS)
    assert any("step 2: 0 samples" in p for p in missing.problems)


def test_a_resume_must_readmit_what_was_open(tmp_path: Path) -> None:
    before = [_admit("p0", 0, 0), _admit("p1", 1, 0), *_trained("p0", 0, 0)]
    marker = {"prompt_id": None, "sample_idx": None, "status": "resumed", "step": 1, "readmit": 1}
    good = [*before, marker, _admit("p1", 1, 1, readmitted=True), *_trained("p1", 1, 1)]
    assert check_ledger(_write(tmp_path / "a", good), LIMITS).require().readmitted == 1
    forgotten = [*before, {**marker, "readmit": 0}, _admit("p2", 2, 1), *_trained("p2", 1, 1)]
    report = check_ledger(_write(tmp_path / "b", forgotten), LIMITS)
    assert report.lost and "p1" in " ".join(report.lost)
    with pytest.raises(LedgerViolation, match="lost"):
        report.require()


def test_the_eta_of_each_admission_is_the_bound_under_adaptive_admission(tmp_path: Path) -> None:
    """``controller.adaptive``: an admitted line carries the η in force for it; the budget replay and the
    trained samples are checked against it, and an η above the run's bound is itself a finding."""

    def admit(pid: str, index: int, version: int, eta: int) -> dict[str, Any]:
        return _admit(pid, index, version) | {"max_staleness": eta}

    tight = [admit("p0", 0, 0, 0), *_trained("p0", 0, 0), admit("p1", 1, 0, 0), *_trained("p1", 1, 0)]
    found = check_ledger(_write(tmp_path / "a", tight), LIMITS).over_bound
    assert sum("(η 0)" in f for f in found) == 2  # p1's samples: staleness 1 > its η 0
    assert sum("admission past the staleness budget" in f for f in found) == 1  # η 0: one group per version
    assert check_ledger(
        _write(tmp_path / "b", [admit("p0", 0, 0, 0), admit("p1", 1, 0, 0)], 0), LIMITS, ended=False
    ).over_bound  # (η 0: one group per version)
    above = [admit("p0", 0, 0, 3), *_trained("p0", 0, 0)]
    assert "above the bound 1" in check_ledger(_write(tmp_path / "c", above, 1), LIMITS).over_bound[0]
    good = [admit("p0", 0, 0, 1), *_trained("p0", 0, 0), admit("p1", 1, 0, 1), *_trained("p1", 1, 0)]
    check_ledger(_write(tmp_path / "d", good), LIMITS, total_steps=2).require()
