"""``python -m benchmarks profile``: this machine's cost profile for ``asyncrl simulate`` and ``asyncrl plan``.

Owns the command: the profile is fitted from the committed measurements (``asyncrl.sim.calibrate``),
refined from run directories with ``--from-runs``, printed, or written to ``--json`` (never over a file).
"""

from __future__ import annotations

import argparse
import json

from asyncrl.config import ConfigError
from asyncrl.results import write_result
from benchmarks.options import add_json

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json``, ``--from-runs``."""
    add_json(parser, "write the profile here (default: print it)")
    parser.add_argument("--from-runs", help="comma-separated run directories to refine the trainer/sync fit")


def run(args: argparse.Namespace) -> None:
    """Fit the profile; print it, or write it to ``--json``."""
    from asyncrl.sim.calibrate import machine_profile
    from asyncrl.sim.profile import save_profile

    runs = [r for r in (args.from_runs or "").split(",") if r]
    try:
        profile = machine_profile(runs=runs)
    except (ValueError, KeyError) as exc:
        raise ConfigError(str(exc)) from exc
    if args.json:
        written = write_result(args.json, lambda scratch: save_profile(profile, scratch))  # never over a file
        print(f"cost profile written to {written}")
    else:
        print(json.dumps(profile.to_dict(), indent=2))
