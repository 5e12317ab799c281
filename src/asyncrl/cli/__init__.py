"""The ``asyncrl`` command line: one module per command (train | sft | eval | generate | serve | simulate |
plan | report | check-config), each with its own ``add_parser(sub)`` and ``run(args)``; this module
builds the parser from them and turns the errors a user can act on into one line (``errors``).

The benchmarks are not part of the product: ``python -m benchmarks NAME`` from a checkout (``benchmarks/``).
Heavy imports happen inside each command, so ``asyncrl --help`` is instant.
"""

from __future__ import annotations

import argparse
import sys

from asyncrl.cli import check_config, evaluate, generate, plan, report, serve, sft, simulate, train
from asyncrl.cli.errors import known_error
from asyncrl.config import ConfigError
from asyncrl.controller.run_claim import RunDirError
from asyncrl.launch import RunStopped

COMMANDS = (train, sft, evaluate, generate, serve, simulate, plan, report, check_config)
"""The command modules, in the order ``asyncrl --help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The ``asyncrl`` parser: each command module registers its own sub-parser."""
    parser = argparse.ArgumentParser(prog="asyncrl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"asyncrl: config error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"asyncrl: {exc}", file=sys.stderr)
        return 2
    except RunDirError as exc:  # a run directory holding another run, or mixing runs: nothing was written
        print(f"asyncrl: {exc}", file=sys.stderr)
        return 2
    except RunStopped as exc:  # e.g. a trainer rank died: the message names the checkpoint to resume from
        print(f"asyncrl: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("asyncrl: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a full disk, a broken verifier, bad input: the message says it all
        known = known_error(exc)
        if known is None:
            raise
        print(f"asyncrl: {known[1]}", file=sys.stderr)
        return known[0]


if __name__ == "__main__":
    sys.exit(main())
