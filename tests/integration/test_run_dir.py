"""A run directory is one run, with real runs of the tiny model: training again into a finished
run's directory is refused and leaves it byte-identical; ``overwrite`` moves it aside and the new
run has its own run id; a resume keeps the id, and the directory still reads as one run."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from asyncrl.config import Config, load_config
from asyncrl.controller.report import make_report
from asyncrl.controller.rundir import RunDirInUse, check_one_run, read_jsonl
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
