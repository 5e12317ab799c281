"""``python -m benchmarks``: one command per benchmark, each with its own options, none in the product.

Every benchmark's ``--help`` runs as its documented command (a subprocess from the repository root);
the list names every benchmark module that has an entry; an unknown name and a result file that
exists are refused in one line (exit 2); ``asyncrl bench`` is no command of the product any more.
The cheap benchmarks run from their documented commands in their own tests (``profile`` in
tests/sim/test_command.py, ``sim-validate`` in test_sim_validate.py, ``paper-curves[-fitted]`` in
test_paper_curves.py, ``adaptive --profile`` in test_adaptive_bench.py and tests/test_results.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.cli import main as asyncrl_main
from benchmarks.__main__ import BENCHMARKS, build_parser, main, module_of

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_each_benchmark_has_its_own_help(name: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks", name, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: python -m benchmarks {name}")


def test_each_benchmark_declares_only_its_options() -> None:
    """No shared flag bag: ``train`` takes no ``--set``, ``engine`` no ``--seeds``, ``profile`` no ``--steps``."""

    def flags(name: str) -> set[str]:
        return {o for a in build_parser(name)._actions for o in a.option_strings}

    assert "--set" not in flags("train") and "--seeds" not in flags("engine") and "--steps" not in flags("profile")
    assert {"--lags", "--objectives", "--lrs"} <= flags("ablation") and "--lags" not in flags("headline")
    for name in BENCHMARKS:
        module = module_of(name)
        assert callable(module.add_arguments) and callable(module.run), name
        assert "--json" in flags(name), name


def test_the_list_names_every_benchmark_module_with_an_entry() -> None:
    listed = {module for module, _ in BENCHMARKS.values()}
    with_entry = {p.stem for p in (REPO / "benchmarks").glob("*.py") if "\ndef run(args" in p.read_text()}
    assert listed == with_entry


def test_the_listing_and_an_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2 and main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in BENCHMARKS)
    assert main(["nonsense"]) == 2
    err = capsys.readouterr().err
    assert "unknown benchmark 'nonsense'" in err and "headline" in err and err.count("\n") == 1


def test_an_existing_result_file_is_refused_at_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = tmp_path / "old.json"
    old.write_text("{}")
    for name in BENCHMARKS:
        assert main([name, "--json", str(old)]) == 2, name
        err = capsys.readouterr().err
        assert str(old) in err and err.count("\n") == 1, (name, err)
    assert old.read_text() == "{}"


def test_asyncrl_bench_is_no_command_of_the_product(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        asyncrl_main(["bench", "headline"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'bench'" in err and "'train'" in err
