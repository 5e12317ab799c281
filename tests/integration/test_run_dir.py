"""A run directory is one run, with real runs of the tiny model: training again into a finished
run's directory is refused and leaves it byte-identical; ``overwrite`` moves it aside and the new
run has its own run id; a resume keeps the id, and the directory still reads as one run."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from asyncrl.config import Config, load_config
from asyncrl.controller.report import make_report
from asyncrl.controller.run_claim import RunDirInUse, check_one_run, read_jsonl
from asyncrl.launch.local import train


def _cfg(model_dir: Path, run_dir: Path, steps: int) -> Config:
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            f"run.run_dir={run_dir}",
            f"controller.total_steps={steps}",
            "controller.max_staleness=1",
            "controller.batch_size=2",
            "controller.max_concurrent=8",
            "controller.checkpoint_every=1",
            "controller.trainer_process=false",
            "rollout.group_size=2",
            "rollout.max_new_tokens=12",
            "rollout.max_slots=16",
            "eval.max_new_tokens=12",
            "task.eval_size=4",
            "task.train_size=100",
            "algo.filter_equal_rewards=false",
            "run.progress=false",
        ],
    )


def _hashes(path: Path) -> dict[str, str]:
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def test_a_run_directory_holds_one_run(tiny_policy_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train(_cfg(tiny_policy_dir, run_dir, steps=2))
    first_id = check_one_run(run_dir)
    assert first_id is not None
    before = _hashes(run_dir)
    assert {"config.yaml", "metrics.jsonl", "trajectories.jsonl", "summary.json"} <= set(before)

    with pytest.raises(RunDirInUse, match="--resume"):
        train(_cfg(tiny_policy_dir, run_dir, steps=2))
    assert _hashes(run_dir) == before  # not a byte changed, nothing added
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]

    train(_cfg(tiny_policy_dir, run_dir, steps=2), overwrite=True)
    (moved,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
    assert _hashes(moved) == before and check_one_run(moved) == first_id
    second_id = check_one_run(run_dir)
    assert second_id not in (None, first_id)

    # a resume continues the same run: same id, steps continue, the report reads it
    train(_cfg(tiny_policy_dir, run_dir, steps=3), resume=True)
    assert check_one_run(run_dir) == second_id
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == [0, 1, 2]
    assert {r["run_id"] for r in read_jsonl(run_dir / "trajectories.jsonl")} == {second_id}
    assert any(r["status"] == "resumed" for r in read_jsonl(run_dir / "trajectories.jsonl"))
    assert make_report(run_dir)


def test_a_resume_refuses_what_it_cannot_honour_and_changes_nothing(tiny_policy_dir: Path, tmp_path: Path) -> None:
    """Real runs: each refusal comes before anything is written (the directory stays byte-identical)
    and says what to do; a run held by another writer is refused naming it."""
    import os
    import shutil

    from asyncrl.config import with_values
    from asyncrl.controller.ledger_checks import check_ledger
    from asyncrl.controller.run_claim import RunDirError
    from asyncrl.controller.run_lock import RunLock

    run_dir = tmp_path / "run"
    cfg = _cfg(tiny_policy_dir, run_dir, steps=2)
    train(cfg)
    before = _hashes(run_dir)
    more = with_values(cfg, {"controller.total_steps": 3})

    def refused(c: Config, match: str, **kw: object) -> None:
        with pytest.raises(RunDirError, match=match):
            train(c, resume=True, **kw)
        assert {k: v for k, v in _hashes(run_dir).items() if k != ".lock"} == before  # (the lock: its holder's)

    refused(cfg, "already finished: it trained 2 steps")
    refused(with_values(more, {"task.seed": 7}), "task.seed: 1234 -> 7.*define the run")
    refused(with_values(more, {"trainer.lr": 0.5}), "--allow-change trainer.lr")
    with RunLock(run_dir):  # another process's run (a lock is per open file, so this process counts as another)
        refused(more, f"in use by another asyncrl process \\(pid {os.getpid()}")
        with pytest.raises(RunDirError, match="in use"):
            train(with_values(cfg, {"run.run_dir": str(run_dir)}), overwrite=True)
    ledger = run_dir / "trajectories.jsonl"
    saved = ledger.read_bytes()
    ledger.write_bytes(saved[: len(saved) // 2])
    with pytest.raises(RunDirError, match="trajectories.jsonl holds .* bytes, fewer than"):
        train(more, resume=True)
    ledger.write_bytes(saved)
    shutil.move(run_dir / "checkpoints", tmp_path / "checkpoints.away")
    with pytest.raises(RunDirError, match="no checkpoint to resume from"):
        train(more, resume=True)
    shutil.move(tmp_path / "checkpoints.away", run_dir / "checkpoints")
    assert _hashes(run_dir) == before

    _, summary = train(with_values(more, {"trainer.lr": 2e-4}), resume=True, allow_change=("trainer.lr",))
    assert summary["steps"] == 3 and not (run_dir / ".lock").exists()
    assert check_ledger(run_dir, total_steps=3).ok
    kept = list((run_dir / "resume").glob("config.yaml.before-*"))
    assert len(kept) == 1 and "0.0001" in kept[0].read_text()
