"""``python -m benchmarks NAME [options]``: the list of the benchmarks and the dispatch to one.

Owns ``BENCHMARKS`` (each name, the module that runs it, and one line saying what it measures) and
``main``: with no name (or ``--help``) it lists them; with a name it builds that benchmark's own parser
(its module's ``add_arguments``), checks the numbers finite and the result file new before any work
(``options.check_result_file``; a benchmark's ``--reanalyse FILE`` is exempt: it asks for FILE to be
recomputed), then calls its module's ``run``. A refused input is one line on stderr and exit 2. Only the
chosen module is imported, so the list is instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

from asyncrl.config import ConfigError
from asyncrl.controller.run_claim import RunDirError
from asyncrl.launch import RunStopped
from benchmarks.options import check_finite, check_result_file

__all__ = ["BENCHMARKS", "build_parser", "main"]

BENCHMARKS: dict[str, tuple[str, str]] = {
    "engine": ("engine", "the engine alone: batched decode and in-flight weight updates (tokens/s)"),
    "decode": ("decode", "decode step time over prompt lengths x sequences running"),
    "train": ("train", "the trainer alone: packed against padded micro-batches (tokens/s)"),
    "async": ("async_bench", "whole runs at max_staleness 0..8 on the named workloads (steady-state throughput)"),
    "interrupt": ("interrupt", "in-flight weight updates (abort, keep) against draining the engine"),
    "ablation": ("ablation", "objectives x lags x learning rates x seeds under controlled staleness"),
    "objectives": ("objectives", "objectives each at its own best step size, under controlled lag and bounded eta"),
    "headline": ("headline", "time to a target accuracy: asynchronous arms against the best synchronous one"),
    "prefix-reuse": ("prefix_reuse", "prefill tokens per multi-turn episode, prefix reuse off and on"),
    "adaptive": ("adaptive", "controller.adaptive against fixed max_staleness, real runs or simulated"),
    "agent-learning": ("agent_learning", "warm start + RL on the calculator agent within a wall budget, per seed"),
    "agent-throughput": ("agent_throughput", "trained tokens/s with slow tools: eta = 4 against the best synchronous"),
    "tinker-loop": ("tinker_loop", "a cookbook-style RL loop via the tinker client against asyncrl train, per seed"),
    "lora-update": ("lora_update", "a LoRA update as adapters alone against full weights: bytes, time to engine"),
    "plan-check": ("plan_check", "asyncrl plan's recommendation run for real beside its alternatives"),
    "profile": ("profile", "this machine's cost profile for asyncrl simulate and asyncrl plan"),
    "sim-validate": ("sim_validate", "the simulator's predictions against measured run directories"),
    "paper-curves": ("paper_report", "AReaL's published curves against the simulator's"),
    "paper-curves-fitted": ("paper_report", "the same, the length median fitted to the paper's synchronous step"),
}
"""Name -> (module of ``benchmarks``, what it measures)."""


def module_of(name: str) -> ModuleType:
    """The module that runs benchmark ``name``."""
    return importlib.import_module(f"benchmarks.{BENCHMARKS[name][0]}")


def _listing() -> str:
    width = max(map(len, BENCHMARKS))
    lines = [f"  {name:<{width}}  {summary}" for name, (_, summary) in BENCHMARKS.items()]
    return "benchmarks (python -m benchmarks NAME --help for the options of one):\n" + "\n".join(lines)


def build_parser(name: str) -> argparse.ArgumentParser:
    """The parser of benchmark ``name``: only the options its module declares."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks {name}", description=BENCHMARKS[name][1])
    module_of(name).add_arguments(parser)
    return parser


def _start(name: str, args: argparse.Namespace) -> None:
    """The checks before any work: numbers finite, the result file new (its plot too)."""
    check_finite(args)
    module = module_of(name)
    if getattr(args, "reanalyse", None):
        return
    target = module.result_file(args) if hasattr(module, "result_file") else args.json
    check_result_file(target, plotted=getattr(module, "PLOTTED", False))


def main(argv: list[str] | None = None) -> int:
    """Run ``python -m benchmarks`` with ``argv`` (default: the process's); the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_listing())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"python -m benchmarks: unknown benchmark {name!r} (available: {', '.join(BENCHMARKS)})", file=sys.stderr)
        return 2
    args = build_parser(name).parse_args(rest)
    args.benchmark = name
    try:
        _start(name, args)
        module_of(name).run(args)
    except ConfigError as exc:
        print(f"benchmarks {name}: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, RunDirError) as exc:  # a missing input; a run directory holding another run
        print(f"benchmarks {name}: {exc}", file=sys.stderr)
        return 2
    except RunStopped as exc:  # e.g. a trainer rank died: the message names the checkpoint to resume from
        print(f"benchmarks {name}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"benchmarks {name}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
