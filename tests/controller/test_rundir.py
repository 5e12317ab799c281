"""A run directory is one run (DESIGN §7): run ids, the guard against reuse, --overwrite, readers
that refuse a mixed directory, and fresh bench directories. Fast: no training (the integration
test ``tests/integration/test_run_dir.py`` does the same with real runs)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from asyncrl import cli
from asyncrl.controller.report import make_report
from asyncrl.controller.run_claim import (
    MixedRunDir,
    RunDirError,
    RunDirInUse,
    check_one_run,
    claim_run_dir,
    fresh_subdir,
    read_jsonl,
    run_ids,
)
from asyncrl.controller.rundir import RunDir, code_version


def _fake_run(path: Path, steps: int = 2) -> str:
    """A small finished run written by ``RunDir`` (metrics, ledger, timeline, summary, a checkpoint)."""
    run = RunDir(path, tensorboard=False)
    for step in range(steps):
        run.log_admitted(f"p{step}", step, step, False)
        run.log_timeline({"t": float(step), "running": 1})
        run.log_step({"step": step, "version": step + 1, "time_s": float(step), "loss": 0.5, "accuracy": 0.5})
    run.write_summary({"steps": steps})
    run.close()
    (path / "config.yaml").write_text("controller:\n  max_staleness: 1\n")
    (path / "checkpoints" / "step-00000001").mkdir(parents=True)
    (path / "checkpoints" / "step-00000001" / "state.pt").write_bytes(b"\x00weights")
    assert run.run_id is not None
    return run.run_id


def _hashes(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def test_every_line_and_the_summary_carry_one_run_id(tmp_path: Path) -> None:
    run_id = _fake_run(tmp_path)
    for name in ("metrics.jsonl", "trajectories.jsonl", "timeline.jsonl"):
        lines = read_jsonl(tmp_path / name)
        assert lines and all(line["run_id"] == run_id for line in lines), name
        assert next(iter(json.loads((tmp_path / name).read_text().splitlines()[0]))) == "run_id"  # first key
    assert json.loads((tmp_path / "summary.json").read_text())["run_id"] == run_id
    assert run_ids(tmp_path) == {run_id} and check_one_run(tmp_path) == run_id


def test_train_into_a_run_directory_is_refused_and_leaves_it_byte_identical(tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "my run"  # a path with a space
    _fake_run(run_dir)
    before = _hashes(run_dir)
    # refused before the warm start or anything else: no model is built, nothing is written
    rc = cli.main(["train", "--run-dir", str(run_dir), "--set", "controller.total_steps=1"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and f"--resume {run_dir}" in err and "--overwrite" in err
    assert "another directory" in err and "never deleted" in err
    assert _hashes(run_dir) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my run"]
    # a fresh RunDir on it (a launcher that skipped the check) refuses too
    with pytest.raises(RunDirInUse):
        RunDir(run_dir, tensorboard=False)
    assert _hashes(run_dir) == before


@pytest.mark.parametrize("only", ["config.yaml", "metrics.jsonl", "trajectories.jsonl", "summary.json"])
def test_any_one_run_file_marks_a_run(tmp_path: Path, only: str) -> None:
    (tmp_path / only).write_text("{}\n")
    with pytest.raises(RunDirInUse, match="--resume"):
        claim_run_dir(tmp_path)


def test_empty_or_missing_directory_is_free(tmp_path: Path) -> None:
    assert claim_run_dir(tmp_path) is None
    assert claim_run_dir(tmp_path / "new") is None
    assert not (tmp_path / "new").exists()  # checking writes nothing


def test_overwrite_moves_the_old_run_aside_never_deletes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    old_id = _fake_run(run_dir)
    before = _hashes(run_dir)
    moved = claim_run_dir(run_dir, overwrite=True)
    assert moved is not None and moved.parent == tmp_path and moved.name.startswith("run.old-")
    assert list(run_dir.iterdir()) == []  # the directory stays (its lock with it), emptied
    assert _hashes(moved) == before and check_one_run(moved) == old_id
    new_id = _fake_run(run_dir)
    assert new_id != old_id and check_one_run(run_dir) == new_id
    again = claim_run_dir(run_dir, overwrite=True)  # a second overwrite in the same second: its own name
    assert again is not None and again != moved and moved.is_dir() and again.is_dir()


def test_resume_keeps_the_run_id_and_checks_the_directory(tmp_path: Path) -> None:
    run = RunDir(tmp_path, tensorboard=False)
    run.log_step({"step": 0})
    cut = run.offsets()
    run.log_step({"step": 1})
    run.close()
    assert claim_run_dir(tmp_path, resume=True) is None
    resumed = RunDir(tmp_path, tensorboard=False, truncate=cut)
    assert resumed.run_id == run.run_id
    resumed.log_step({"step": 1})
    resumed.close()
    assert [m["run_id"] for m in read_jsonl(tmp_path / "metrics.jsonl")] == [run.run_id] * 2
    with pytest.raises(RunDirError, match="cannot be combined"):
        claim_run_dir(tmp_path, resume=True, overwrite=True)
    with pytest.raises(FileNotFoundError):
        claim_run_dir(tmp_path / "missing", resume=True)


def test_resuming_a_run_from_before_run_ids_adds_none(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0}) + "\n")
    resumed = RunDir(
        tmp_path, tensorboard=False, truncate={"metrics.jsonl": (tmp_path / "metrics.jsonl").stat().st_size}
    )
    resumed.log_step({"step": 1})
    resumed.close()
    assert [set(m) for m in read_jsonl(tmp_path / "metrics.jsonl")] == [{"step"}, {"step"}]
    assert check_one_run(tmp_path) is None


def _mix(path: Path) -> None:
    """Two runs' lines in one directory, as a version without the guard wrote them."""
    first = path / "first"
    second = path / "second"
    _fake_run(first, steps=3)
    _fake_run(second, steps=2)
    for name in ("metrics.jsonl", "trajectories.jsonl", "timeline.jsonl"):
        (first / name).write_text((first / name).read_text() + (second / name).read_text())


def test_report_and_resume_refuse_a_directory_that_mixes_runs(tmp_path: Path, capsys) -> None:
    _mix(tmp_path)
    mixed = tmp_path / "first"
    with pytest.raises(MixedRunDir, match="mixes 2 runs"):
        check_one_run(mixed)
    with pytest.raises(MixedRunDir):
        make_report(mixed)
    assert not (mixed / "plots").exists()
    assert cli.main(["report", str(mixed)]) == 2
    assert "mixes 2 runs" in capsys.readouterr().err
    with pytest.raises(MixedRunDir):
        claim_run_dir(mixed, resume=True)
    with pytest.raises(MixedRunDir):
        RunDir(mixed, tensorboard=False, truncate={})


def test_two_runs_without_ids_are_caught_by_their_steps(tmp_path: Path) -> None:
    lines = [{"step": s, "time_s": float(s)} for s in (0, 1, 2, 0, 1)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    with pytest.raises(MixedRunDir, match="from step 2 back to step 0"):
        check_one_run(tmp_path)


def test_bench_invocations_get_fresh_directories(tmp_path: Path) -> None:
    first, second = fresh_subdir(tmp_path / "bench"), fresh_subdir(tmp_path / "bench")
    assert first != second and first.is_dir() and second.is_dir()
    assert first.parent == second.parent == tmp_path / "bench"


def test_the_run_directory_takes_the_config_as_plain_data(tmp_path: Path) -> None:
    """The whole ``Config`` stops at ``launch/``: the run directory gets ``to_dict(cfg)`` and writes it as
    ``config.yaml``; handed the object itself it refuses before writing anything."""
    import yaml

    from asyncrl.config import Config, to_dict

    with pytest.raises(TypeError, match="plain data"):
        RunDir(tmp_path / "object", Config(), tensorboard=False)  # type: ignore[arg-type]
    assert not (tmp_path / "object").exists()
    run = RunDir(tmp_path / "dict", to_dict(Config()), tensorboard=False)
    run.close()
    assert yaml.safe_load((tmp_path / "dict" / "config.yaml").read_text()) == yaml.safe_load(
        yaml.safe_dump(to_dict(Config()), sort_keys=False)
    )


def test_the_code_version_names_the_checkout_commit_or_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import re
    import subprocess

    from asyncrl import __version__, controller

    version = code_version()
    assert version["asyncrl"] == __version__
    root = Path(controller.__file__).resolve().parents[3]
    if (root / ".git").exists():  # the tests run from a git checkout (CI: a clean clone)
        assert re.fullmatch(r"[0-9a-f]{40}", version["git_commit"]) and isinstance(version["git_dirty"], bool)

    def no_git(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    assert code_version() == {"asyncrl": __version__, "git_commit": None, "git_dirty": None}
