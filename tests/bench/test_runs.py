"""``bench.runs``: what the whole-run benches share (a fresh directory per invocation, the table, the
JSON); ``run_and_measure`` trains, so the benches' own runs cover it, not this file."""

from __future__ import annotations

import json

from asyncrl.bench.runs import fresh_out, mean_or_zero, print_table, write_json


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
