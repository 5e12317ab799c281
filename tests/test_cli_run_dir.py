"""``asyncrl train`` and ``check-config`` on run directories and output paths a user cannot use: one
line ``asyncrl: ...`` and exit 2 before anything runs (no warm start, no model load, no traceback)."""

from __future__ import annotations

from pathlib import Path

import pytest

import asyncrl.launch.warm_start as warm_start
from asyncrl.cli import main
from asyncrl.config import dump_yaml, load_config


@pytest.fixture
def no_warm_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Anything past the run directory's checks would build a model: fail loudly if it is reached."""

    def reached(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run went past its run directory's checks")

    monkeypatch.setattr(warm_start, "ensure_policy", reached)
    monkeypatch.setattr("asyncrl.launch.local.ensure_policy", reached)


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("asyncrl: ") and "Traceback" not in err, err
    return err


def test_resume_refuses_run_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str], no_warm_start: None) -> None:
    run = tmp_path / "run"
    run.mkdir()
    dump_yaml(load_config(), run / "config.yaml")
    assert main(["train", "--resume", str(run), "--run-dir", str(tmp_path / "elsewhere")]) == 2
    assert "--run-dir cannot be combined with it" in _one_line(capsys)
    assert not (tmp_path / "elsewhere").exists()
    assert main(["train", "--allow-change", "trainer.lr"]) == 2
    assert "--allow-change only applies to --resume" in _one_line(capsys)


@pytest.mark.parametrize("where", ["a-file", "under-a-file", "unwritable"])
def test_an_unusable_path_is_one_line_before_anything_runs(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    no_warm_start: None,
    where: str,
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a directory\n")
    run_dir = {"a-file": afile, "under-a-file": afile / "sub", "unwritable": tmp_path / "ro" / "run"}[where]
    if where == "unwritable":  # root writes into read-only directories: make the open itself refuse

        def refuse(*args: object, **kwargs: object) -> int:
            raise PermissionError(13, "Permission denied", str(run_dir / ".lock"))

        monkeypatch.setattr("asyncrl.controller.run_lock.os.open", refuse)
    assert main(["train", "--run-dir", str(run_dir)]) == 2
    line = _one_line(capsys)
    assert f"cannot use {run_dir} as a run directory" in line
    why = {"a-file": "it is a file", "under-a-file": "Not a directory", "unwritable": "Permission denied"}[where]
    assert why in line
    assert afile.read_text() == "not a directory\n"


def test_check_config_output_that_cannot_be_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["check-config", "--output", str(afile / "out.yaml")]) == 2
    line = _one_line(capsys)
    assert "cannot use" in line and str(afile / "out.yaml") in line


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "--model", "m", "--input", "i", "--output", "o", "--top-p", "nan"],
        ["generate", "--model", "m", "--input", "i", "--output", "o", "--temperature", "inf"],
        ["serve", "reward", "--timeout", "nan"],
        ["plan", "--target", "nan"],
        ["plan", "--max-mean-staleness", "inf"],
    ],
)
def test_a_non_finite_number_flag_is_refused_in_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "must be a finite number" in err and "Traceback" not in err
