"""``bench.runs``: what the whole-run benches share (a fresh directory per invocation, the table, the
JSON, a row's run directory found again); ``run_and_measure`` trains, so the benches' own runs cover
it, not this file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.runs import fresh_out, mean_or_zero, print_table, resolve_run_dir, train_or_stop, write_json


def test_each_invocation_gets_its_own_directory(tmp_path) -> None:
    first, second = fresh_out(str(tmp_path / "b")), fresh_out(str(tmp_path / "b"))
    assert first != second and first.is_dir() and second.is_dir() and first.parent == second.parent


def test_the_table_and_the_json(tmp_path, capsys) -> None:
    print_table("t", [{"a": 1.23456, "b": "x"}], ["a", "b"], width=8, digits=2)
    assert capsys.readouterr().out == "\nt\n       a         b\n    1.23         x\n"
    write_json(str(tmp_path / "d" / "r.json"), {"rows": [1]})
    assert json.loads((tmp_path / "d" / "r.json").read_text()) == {"rows": [1]}
    write_json(None, {"rows": [1]})  # no path: nothing written, no error
    assert mean_or_zero([]) == 0.0 and mean_or_zero([1.0, 2.0]) == 1.5


def test_a_relative_run_dir_is_found_from_another_folder(tmp_path, monkeypatch) -> None:
    """A JSON in ``repo/docs/results`` naming ``runs/a`` (relative to the repository root, where the
    bench ran): found from the repository root, from elsewhere, and under the current folder first."""
    repo = tmp_path / "repo"
    (repo / "runs" / "a").mkdir(parents=True)
    (repo / "docs" / "results").mkdir(parents=True)
    (tmp_path / "elsewhere" / "runs" / "a").mkdir(parents=True)
    (tmp_path / "empty").mkdir()
    json_path = repo / "docs" / "results" / "bench.json"
    monkeypatch.chdir(repo)
    assert resolve_run_dir("runs/a", "docs/results/bench.json") == repo / "runs" / "a"
    monkeypatch.chdir(tmp_path / "empty")
    assert resolve_run_dir("runs/a", json_path) == repo / "runs" / "a"  # from the JSON's location
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert resolve_run_dir("runs/a", json_path) == tmp_path / "elsewhere" / "runs" / "a"  # the current folder first
    assert resolve_run_dir(str(repo / "runs" / "a"), json_path) == repo / "runs" / "a"  # absolute: as stored


def test_a_missing_run_dir_is_named(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"run directory runs/gone \(a row of .*bench.json\) not found"):
        resolve_run_dir("runs/gone", tmp_path / "bench.json")
    with pytest.raises(FileNotFoundError, match=f"run directory {tmp_path}/gone .* does not exist"):
        resolve_run_dir(str(tmp_path / "gone"), tmp_path / "bench.json")


@pytest.mark.parametrize("stop_reason", [None, "SIGTERM"])
def test_a_run_stopped_by_a_signal_stops_the_bench(
    stop_reason: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncrl.launch import local

    def fake_train(cfg: Any) -> tuple[Path, dict[str, Any]]:
        return tmp_path, {"stop_reason": stop_reason, "steps": 3}

    monkeypatch.setattr(local, "train", fake_train)
    if stop_reason is None:
        assert train_or_stop(object()) == (tmp_path, {"stop_reason": None, "steps": 3})
    else:
        with pytest.raises(KeyboardInterrupt, match="stopped by SIGTERM"):
            train_or_stop(object())
