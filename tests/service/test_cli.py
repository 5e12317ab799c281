"""``asyncrl serve training`` refuses what cannot work, in one line, before loading anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.cli import main


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "needs --model DIR"),
        (["--model", "{tiny}", "--api-key", "secret"], "begin with 'tml-'"),
        (["--model", "{missing}"], "has no config.json"),
        (["--model", "{tiny}", "--host", "0.0.0.0"], "refusing to start the training server"),
    ],
)
def test_serve_training_refuses_in_one_line(
    argv, says, tiny_policy_dir: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.delenv("ASYNCRL_API_KEY", raising=False)
    argv = [a.format(tiny=tiny_policy_dir, missing=tmp_path / "nothing") for a in argv]
    assert main(["serve", "training", "--root", str(tmp_path / "root"), *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
