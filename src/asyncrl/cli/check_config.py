"""``asyncrl check-config``: validate a config and print (or ``--output``) the resolved tree."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from asyncrl.cli.common import add_config_args, load
from asyncrl.config import dump_yaml


def add_parser(sub: Any) -> None:
    """Register ``asyncrl check-config``."""
    p = sub.add_parser("check-config", help="validate a config and print the resolved tree")
    add_config_args(p)
    p.add_argument("--output", help="write the resolved YAML here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the resolved config (or write it to ``--output``)."""
    cfg = load(args)
    out = Path(args.output) if args.output else None
    if out:
        dump_yaml(cfg, out)
    else:
        import yaml

        from asyncrl.config import to_dict

        print(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    return 0
