"""``asyncrl.results``: a bench never replaces a result file. An existing ``--json`` (or the plot beside it) is
refused at the start of the invocation in one line, bytes untouched; a file that appears while the bench
runs (a second bench given the same ``--json``) is kept and the result written beside it; ``--reanalyse``
keeps the previous file beside the new one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncrl import results as output
from asyncrl.results import ResultFileError, check_result_path, replace_result, write_result, write_text_result
from benchmarks.__main__ import main

OLD = b'{"rows": ["the result of last night"]}\n'


def _existing(tmp_path: Path, name: str = "old.json") -> Path:
    path = tmp_path / name
    path.write_bytes(OLD)
    return path


def test_an_existing_result_file_is_refused_by_name(tmp_path: Path) -> None:
    path = _existing(tmp_path)
    with pytest.raises(ResultFileError) as err:
        check_result_path(path)
    assert str(path) in str(err.value) and "already exists" in str(err.value) and "\n" not in str(err.value)
    assert path.read_bytes() == OLD
    check_result_path(tmp_path / "new.json")  # a new name passes
    check_result_path(tmp_path / "made" / "new.json")  # its folder is made


def test_the_plot_beside_it_is_refused_too(tmp_path: Path) -> None:
    plot = _existing(tmp_path, "out.png")
    with pytest.raises(ResultFileError, match="out.png .written beside --json .*out.json. already exists"):
        check_result_path(tmp_path / "out.json", beside=(".png",))
    check_result_path(tmp_path / "out.json")  # a bench that writes no plot does not care
    assert plot.read_bytes() == OLD


@pytest.mark.parametrize("where", ["a file as the folder", "a directory as the file"])
def test_a_place_that_cannot_hold_the_result_is_refused(tmp_path: Path, where: str) -> None:
    if where == "a file as the folder":
        _existing(tmp_path, "plain")
        target = tmp_path / "plain" / "out.json"
        message = "cannot write bench result file .*plain/out.json: .*plain is a file, not a folder"
    else:
        (tmp_path / "out.json").mkdir()
        target = tmp_path / "out.json"
        message = "already exists"
    with pytest.raises(ResultFileError, match=message):
        check_result_path(target)


def test_a_new_result_is_written_whole_with_no_scratch_left(tmp_path: Path) -> None:
    written = write_text_result(tmp_path / "d" / "out.json", '{"rows": [1]}')
    assert written == tmp_path / "d" / "out.json"
    assert json.loads(written.read_text()) == {"rows": [1]}
    assert sorted(p.name for p in written.parent.iterdir()) == ["out.json"]


@pytest.mark.parametrize("hard_links", [True, False], ids=["link", "exclusive-create"])
def test_a_file_that_appears_while_the_bench_runs_is_kept_and_the_result_goes_beside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, hard_links: bool
) -> None:
    if not hard_links:  # a filesystem without hard links: the exclusive create must hold the same way

        def no_link(src: object, dst: object) -> None:
            raise PermissionError(1, "Operation not permitted")

        monkeypatch.setattr(output.os, "link", no_link)
    target = tmp_path / "out.json"
    check_result_path(target)  # the start of the invocation: free
    target.write_bytes(OLD)  # another bench with the same --json finished first
    written = write_text_result(target, '{"rows": ["mine"]}')
    assert written == tmp_path / "out.1.json"
    assert target.read_bytes() == OLD
    assert json.loads(written.read_text()) == {"rows": ["mine"]}
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(target) in err and str(written) in err
    third = write_text_result(target, '{"rows": ["third"]}')  # a third writer: the next free number
    assert third == tmp_path / "out.2.json" and json.loads(third.read_text()) == {"rows": ["third"]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.1.json", "out.2.json", "out.json"]


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    def broken(scratch: Path) -> None:
        scratch.write_text('{"rows": [')
        raise RuntimeError("the plot failed")

    with pytest.raises(RuntimeError):
        write_result(tmp_path / "out.json", broken)
    assert list(tmp_path.iterdir()) == []  # neither a torn result nor a scratch file


def test_reanalyse_keeps_the_previous_file_beside_the_new_one(tmp_path: Path) -> None:
    path = _existing(tmp_path, "out.json")
    assert replace_result(path, lambda scratch: scratch.write_text('{"rows": ["again"]}')) == path
    assert json.loads(path.read_text()) == {"rows": ["again"]}
    kept = [p for p in tmp_path.iterdir() if p != path]
    assert len(kept) == 1 and kept[0].name.startswith("out.old-") and kept[0].suffix == ".json"
    assert kept[0].read_bytes() == OLD
    replace_result(path, lambda scratch: scratch.write_text("{}"))  # twice in one second: both kept
    assert len(list(tmp_path.iterdir())) == 3


# ------------------------------------------------------------------------------------------------ the CLI
def test_bench_refuses_an_existing_json_at_the_start_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _existing(tmp_path)
    runs = tmp_path / "runs"
    assert main(["async", "--json", str(path), "--out", str(runs), "--steps", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("benchmarks async: ") and captured.err.count("\n") == 1 and str(path) in captured.err
    assert "already exists" in captured.err
    assert path.read_bytes() == OLD
    assert not runs.exists()  # refused before any work: no run directory made


def test_bench_refuses_an_existing_plot_beside_the_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _existing(tmp_path, "h.png")
    assert main(["headline", "--json", str(tmp_path / "h.json"), "--out", str(tmp_path / "r")]) == 2
    assert "h.png" in capsys.readouterr().err
    assert not (tmp_path / "h.json").exists() and not (tmp_path / "r").exists()


def test_paper_curves_refuses_its_default_file_when_it_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks.paper_report import DEFAULT_JSON

    monkeypatch.chdir(tmp_path)
    (tmp_path / DEFAULT_JSON).parent.mkdir(parents=True)
    (tmp_path / DEFAULT_JSON).write_bytes(OLD)
    assert main(["paper-curves"]) == 2
    assert DEFAULT_JSON in capsys.readouterr().err
    assert (tmp_path / DEFAULT_JSON).read_bytes() == OLD


@pytest.mark.parametrize("flag", ["--warmup-s", "--snapshot-every", "--time-budget-s"])
def test_a_non_finite_number_option_is_refused(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["headline", flag, "nan"]) == 2
    assert capsys.readouterr().err == f"benchmarks headline: {flag} must be a finite number, got nan\n"


def test_an_ablation_lr_out_of_range_is_refused_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    assert main(["ablation", "--lrs", "1e-4,-1", "--out", str(runs)]) == 2
    assert "trainer.lr must be > 0, got -1.0" in capsys.readouterr().err
    assert not runs.exists()


def test_two_benches_with_one_json_keep_both_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real (simulated) bench whose ``--json`` another bench writes after this one's start check, while it
    runs: the other's file is kept byte for byte and this result goes beside it, said in one line."""
    from benchmarks import adaptive

    out = tmp_path / "adaptive.json"
    bench = adaptive.run_adaptive_bench

    def another_bench_finishes_first(json_path: str, **kw: Any) -> Any:
        Path(json_path).write_bytes(OLD)
        return bench(json_path, **kw)

    monkeypatch.setattr(adaptive, "run_adaptive_bench", another_bench_finishes_first)
    argv = [
        "adaptive",
        "--profile",
        "cpu-2core-tiny",
        "--workload",
        "task",
        "--etas",
        "0,2",
        "--seeds",
        "0",
        "--steps",
        "10",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    assert out.read_bytes() == OLD
    beside = tmp_path / "adaptive.1.json"
    assert [r["arm"] for r in json.loads(beside.read_text())["rows"]] == ["eta=0", "eta=2", "adaptive"]
    assert f"this result is in {beside}" in capsys.readouterr().err
