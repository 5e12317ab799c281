"""Resume building blocks: checkpoint discovery/pruning, the ledger cut, the prompt stream, counters."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from asyncrl.controller.resume import (
    check_snapshot,
    checkpoint_dir,
    latest_checkpoint,
    list_checkpoints,
    prompt_at,
    prune_checkpoints,
)
from asyncrl.controller.rundir import RunDir, read_jsonl
from asyncrl.controller.staleness import StalenessGate
from asyncrl.controller.state import ControllerState
from asyncrl.data.prompts import PromptSource
from asyncrl.types import Prompt


def _fake_checkpoint(run: Path, step: int, complete: bool = True) -> Path:
    path = checkpoint_dir(run, step)
    path.mkdir(parents=True)
    if complete:
        (path / "trainer_state.pt").write_bytes(b"x")
    return path


def test_latest_ignores_incomplete_and_prune_keeps_newest(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None
    for step in (2, 10, 4):
        _fake_checkpoint(tmp_path, step)
    _fake_checkpoint(tmp_path, 12, complete=False)  # a save killed half-way (no state file)
    (tmp_path / "checkpoints" / ".step-00000014.tmp-1").mkdir()
    assert latest_checkpoint(tmp_path).name == "step-00000010"  # numeric order, complete only
    prune_checkpoints(tmp_path, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000004", "step-00000010"]
    assert not list((tmp_path / "checkpoints").glob(".step-*"))


def test_rundir_cut_back_to_offsets_keeps_the_tail(tmp_path: Path) -> None:
    run = RunDir(tmp_path, tensorboard=False)
    run.log_admitted("p0", 0, 0, False)
    run.log_step({"step": 0, "loss": 1.0})
    cut = run.offsets()
    run.log_admitted("p1", 1, 0, False)
    run.log_step({"step": 1, "loss": float("nan")})
    run.close()
    resumed = RunDir(tmp_path, tensorboard=False, truncate=cut)
    resumed.log_admitted("p1", 1, 1, True)
    resumed.close()
    ledger = read_jsonl(tmp_path / "trajectories.jsonl")
    assert [(r["prompt_id"], r["readmitted"]) for r in ledger] == [("p0", False), ("p1", True)]
    assert [m["step"] for m in read_jsonl(tmp_path / "metrics.jsonl")] == [0]
    tails = sorted((tmp_path / "resume").iterdir())
    assert len(tails) == 2 and any("p1" in t.read_text() for t in tails)
    # no offsets at all (a resume without a checkpoint): everything is cut
    RunDir(tmp_path, tensorboard=False, truncate={}).close()
    assert read_jsonl(tmp_path / "trajectories.jsonl") == []


def test_prompt_at_is_random_access_into_the_stream() -> None:
    prompts = [Prompt(f"q{i}", (1, 2, i)) for i in range(5)]
    source = PromptSource(prompts, seed=3)
    stream = [source.next().prompt_id for _ in range(12)]  # crosses two epoch boundaries
    assert source.position == 12
    assert [prompt_at(source, i).prompt_id for i in range(12)] == stream
    assert source.position == 12


def test_controller_state_round_trip_through_json() -> None:
    state = ControllerState(step=7, trained_tokens=123, stale_groups=2, staleness_hist=Counter({0: 5, 3: 2}))
    back = ControllerState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert back == state and back.staleness_hist[3] == 2


def test_restored_gate_admits_exactly_the_staleness_budget() -> None:
    """After training k steps of B groups the snapshot keeps accepted = k * B: admission resumes
    with (η + 1) * B groups, not (η + k + 1) * B as with reset counters."""
    gate = StalenessGate(batch_size=4, max_staleness=2, max_concurrent=1000)
    gate.load_state_dict({"accepted": 5 * 4})
    assert gate.capacity(version=5) == 3 * 4


def test_snapshot_validation() -> None:
    with pytest.raises(ValueError):
        check_snapshot({"format": 99})
    with pytest.raises(ValueError):
        check_snapshot({"format": 1, "step": 0})
