"""The options several benchmarks read, each added by the benchmark that reads it, and the start checks.

Owns the helpers a benchmark's ``add_arguments`` calls for an option it shares with others (``--json``,
``--set``/``--model``, ``--seeds``, ``--warmup-s``, ``--out``, ``--steps``): each takes the benchmark's own
default and help, so no benchmark carries an option it does not read. Owns too what happens before any
work: ``check_finite`` (argparse reads ``nan``) and ``check_result_file`` (the result file, and the plot
beside it, must not exist yet, in a folder this user can write: ``asyncrl.results``), and the parsing of
comma-separated lists and of the config overrides, each refused in one line (a ``ConfigError``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from asyncrl.config import ConfigError, load_config
from asyncrl.results import check_result_path

__all__ = [
    "add_json",
    "add_out",
    "add_reanalyse",
    "add_overrides",
    "add_seeds",
    "add_steps",
    "add_warmup",
    "check_finite",
    "check_result_file",
    "overrides",
    "parse_list",
]

T = TypeVar("T")


def add_json(parser: argparse.ArgumentParser, help: str = "write the result rows and ratios here") -> None:
    """``--json PATH``: the result file (refused at start if it exists)."""
    parser.add_argument("--json", help=help)


def add_overrides(parser: argparse.ArgumentParser, model_help: str = "model directory of every run") -> None:
    """``--set KEY=VALUE`` (repeatable) and ``--model DIR``: config overrides of every run of the benchmark."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override applied to every run (repeatable)",
    )
    parser.add_argument("--model", help=model_help)


def add_seeds(parser: argparse.ArgumentParser, default: str, what: str = "run.seed values") -> None:
    """``--seeds A,B,...``: the seeds of the benchmark (``default`` shown in the help)."""
    parser.add_argument("--seeds", help=f"comma-separated {what} (default {default})")


def add_warmup(parser: argparse.ArgumentParser, default: float = 60.0) -> None:
    """``--warmup-s S``: seconds of RL time before the steady-state window opens."""
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=default,
        help=f"seconds of RL time before the steady-state window opens (default {default:g})",
    )


def add_out(parser: argparse.ArgumentParser, default: str) -> None:
    """``--out DIR``: where the benchmark's run directories go (a fresh one per invocation)."""
    parser.add_argument("--out", default=default, help=f"where run directories go (default {default})")


def _existing_directory(text: str) -> str:
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a directory")
    return text


def add_reuse(parser: argparse.ArgumentParser, what: str = "arms") -> None:
    """``--reuse DIR``: an interrupted invocation's run directory, whose finished runs are read, not made again."""
    parser.add_argument(
        "--reuse",
        metavar="DIR",
        type=_existing_directory,
        help=f"read the finished {what} of an interrupted invocation's run directory (<out>/<timestamp>) instead "
        "of running them again",
    )


def add_reanalyse(parser: argparse.ArgumentParser) -> None:
    """``--reanalyse FILE``: recompute a finished result file from its runs (nothing runs)."""
    parser.add_argument(
        "--reanalyse", metavar="FILE", help="recompute a finished result file from its runs (nothing runs)"
    )


def add_steps(parser: argparse.ArgumentParser, help: str = "training steps per run (default: the config's)") -> None:
    """``--steps N``: training steps per run."""
    parser.add_argument("--steps", type=int, help=help)


def parse_list(text: str | None, cast: Callable[[str], T], default: tuple[T, ...], option: str) -> tuple[T, ...]:
    """A comma-separated option as a tuple (``default`` when not given); a bad item is a ``ConfigError``."""
    if not text:
        return default
    try:
        return tuple(cast(x) for x in text.split(","))
    except ValueError as exc:
        raise ConfigError(f"{option} takes comma-separated {cast.__name__} values: {exc}") from exc


def overrides(args: argparse.Namespace) -> list[str]:
    """The config overrides of every run (``--set``, then ``--model``), checked now, before any run."""
    items = [*args.overrides, *([f"model.path={args.model}"] if args.model else [])]
    load_config(None, items)
    return items


def check_finite(args: argparse.Namespace) -> None:
    """Every number option finite: argparse reads ``nan`` and ``inf``."""
    for name, value in vars(args).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"--{name.replace('_', '-')} must be a finite number, got {value}")


def check_result_file(target: str | None, plotted: bool) -> None:
    """Before any work: ``target`` (and, for a benchmark that plots, the ``.png`` beside it) must not exist
    yet, in a folder this user can write; a benchmark never replaces a result (``asyncrl.results``)."""
    if target:
        check_result_path(target, beside=(".png",) if plotted else ())
