"""``docs/cli.md``'s reference agrees with the parser (``scripts/cli_reference.py``): a command or flag
added, removed or re-described without regenerating the page fails here."""

from __future__ import annotations

import argparse

import pytest

from tests.script_module import load_script


@pytest.fixture(scope="module")
def cli_reference():
    return load_script("cli_reference")


def test_the_committed_cli_reference_is_the_parsers(cli_reference) -> None:
    assert cli_reference.current() == cli_reference.render(), "run: python scripts/cli_reference.py"


def test_every_command_and_argument_is_rendered(cli_reference) -> None:
    parser = argparse.ArgumentParser(prog="tool")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run a | b", description="Run something. Longer text.")
    p.add_argument("target", choices=["x", "y"], help="what to run")
    p.add_argument("--out", required=True, help="where <dir> goes")
    p.add_argument("--n", type=int, default=3, help="how many (default %(default)s)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--fast", action="store_true")
    p.add_argument("--files", nargs="+", metavar="FILE")
    q = sub.add_parser("db", help="database commands")
    inner = q.add_subparsers(dest="what")
    inner.add_parser("init", help="create it")
    text = cli_reference.render(parser)
    assert text.startswith(cli_reference.BEGIN) and text.rstrip().endswith(cli_reference.END)
    assert "| [`tool run`](#tool-run) | run a \\| b |" in text
    assert "Run something. Longer text." in text
    assert "| `target` | `{x,y}` |  | what to run |" in text
    assert "| `--out` | `OUT` (required) |  | where &lt;dir> goes |" in text
    assert "| `--n` | `N: int` | `3` | how many (default 3) |" in text
    assert "| `--set` | `KEY=VALUE` (repeatable) |  |  |" in text
    assert "| `--fast` | (flag) |  |  |" in text
    assert "| `--files` | `FILE [...]` |  |  |" in text
    assert "### `tool db init`" in text and "Create it." in text
