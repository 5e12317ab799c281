"""``asyncrl sft``: build and warm-start the tiny default model (cached), or write it to ``--output``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from asyncrl.cli.common import add_config_args, load
from asyncrl.config import with_values


def add_parser(sub: Any) -> None:
    """Register ``asyncrl sft``."""
    p = sub.add_parser("sft", help="build and warm-start the tiny default model (cached)")
    add_config_args(p)
    p.add_argument("--output", help="write the model here instead of the cache")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build or reuse the warm-started tiny model (or write it to ``--output``)."""
    cfg = load(args)
    from asyncrl.launch.warm_start import ensure_policy, run_warm_start

    if args.output:
        stats = run_warm_start(cfg, args.output)
        print(json.dumps(stats, indent=2))
        print(f"model directory: {args.output}")
    else:
        print(f"model directory: {ensure_policy(with_values(cfg, {'model.path': None}))}")
    return 0
