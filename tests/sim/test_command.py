"""``asyncrl simulate`` and ``python -m benchmarks profile`` from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.cli import main
from benchmarks.__main__ import main as bench_main


def test_simulate_prints_writes_json_and_a_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out, res = tmp_path / "run", tmp_path / "r.json"
    rc = main(
        [
            "simulate",
            "--set",
            "total_steps=5",
            "--set",
            "batch_size=4",
            "--set",
            "max_staleness=2",
            "--out",
            str(out),
            "--json",
            str(res),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "effective throughput" in text and "staleness" in text
    data = json.loads(res.read_text())
    assert data["scenario"]["max_staleness"] == 2 and data["result"]["steps"] == 5
    assert (out / "metrics.jsonl").is_file() and (out / "timeline.jsonl").is_file()


def test_simulate_refuses_unknown_keys_and_two_sources(capsys: pytest.CaptureFixture) -> None:
    assert main(["simulate", "--set", "eta=1"]) == 2
    assert "unknown scenario key 'eta'" in capsys.readouterr().err
    assert main(["simulate", "--scenario", "a.yaml", "--config", "b.yaml"]) == 2


def test_bench_profile_writes_this_machines_profile(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    assert bench_main(["profile", "--json", str(path)]) == 0
    assert json.loads(path.read_text())["name"] == "cpu-2core-tiny"
