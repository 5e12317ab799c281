"""``scripts/bench_smoke.py``: every benchmark ``docs/results.md`` cites has a smoke, each smoke's command line
is accepted by its benchmark's own parser, and the committed summary covers every cited benchmark."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from benchmarks.__main__ import BENCHMARKS, build_parser
from tests.repo_paths import RESULTS, SCRIPTS


@pytest.fixture(scope="module")
def bench_smoke():
    """The script as a module, registered in ``sys.modules`` while it runs (its dataclass looks its module up)."""
    spec = importlib.util.spec_from_file_location("bench_smoke", SCRIPTS / "bench_smoke.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_smoke"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("bench_smoke", None)


def test_every_cited_benchmark_has_a_smoke(bench_smoke) -> None:
    cited = bench_smoke.cited()
    assert "headline" in cited and "tinker-loop" in cited  # the reading of docs/results.md finds the commands
    assert set(cited) <= {s.name for s in bench_smoke.SMOKES}
    assert {s.name for s in bench_smoke.SMOKES} <= set(BENCHMARKS)


def test_each_smoke_parses_with_its_benchmarks_own_options(bench_smoke, tmp_path) -> None:
    values = {"async_runs": "runs/a,runs/b", "headline_json": "h.json"}
    for smoke in bench_smoke.SMOKES:
        argv = bench_smoke.argv_of(smoke, str(tmp_path / "r.json"), str(tmp_path / "runs"), values)
        args = build_parser(argv[0]).parse_args(argv[1:])  # an unknown option exits 2 here
        assert args.json == str(tmp_path / "r.json"), smoke.label
        assert (getattr(args, "out", None) == str(tmp_path / "runs")) == smoke.out, smoke.label
    assert all(need in {s.label for s in bench_smoke.SMOKES} for need in bench_smoke.NEEDS.values())


def test_the_committed_summary_covers_every_cited_benchmark(bench_smoke) -> None:
    summary = json.loads((RESULTS / "bench_smoke.json").read_text())
    ran = {e["command"].split()[3] for e in summary["benchmarks"]}  # python -m benchmarks NAME ...
    assert set(bench_smoke.cited()) <= ran
    assert summary["failed"] == [e["benchmark"] for e in summary["benchmarks"] if e["rc"] != 0 or not e["result_bytes"]]
