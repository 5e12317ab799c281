"""``asyncrl report RUN_DIR``: PNG plots of a run directory (reward, throughput, staleness, timeline, tools)."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    """Register ``asyncrl report``."""
    p = sub.add_parser("report", help="PNG plots of a run directory (reward, throughput, staleness, timeline)")
    p.add_argument("run_dir")
    p.add_argument("--output", help="directory for the plots (default RUN_DIR/plots)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the run's plots; prints their paths."""
    from asyncrl.controller.report import make_report

    for path in make_report(args.run_dir, args.output):
        print(path)
    return 0
