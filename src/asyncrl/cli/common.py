"""What every ``asyncrl`` command that takes a config shares: ``--config FILE`` and ``--set key=value``
(unknown keys are an error naming the valid ones), and loading them (``load``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from asyncrl.config import Config, load_config


def add_config_args(p: argparse.ArgumentParser) -> None:
    """``--config FILE`` and repeatable ``--set KEY=VALUE``."""
    p.add_argument("--config", help="YAML config file (any subset of the config tree)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one field, e.g. --set controller.max_staleness=0 (repeatable)",
    )


def load(args: argparse.Namespace, base: Path | None = None) -> Config:
    """The config of ``--config`` and ``--set`` (layered over ``base``: a resumed run's saved config);
    this process's torch threads are set from it (``run.torch_threads``)."""
    from asyncrl.launch.stages import configure_threads

    cfg = load_config(args.config, args.overrides, base=base)
    configure_threads(cfg)
    return cfg
