"""``asyncrl train``: warm start (cached), then asynchronous RL into a run directory; ``--resume`` continues one."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, get_args

from asyncrl.choices import LaunchKind
from asyncrl.cli.common import add_config_args, load
from asyncrl.config import with_values
from asyncrl.controller.run_claim import RunDirError


def add_parser(sub: Any) -> None:
    """Register ``asyncrl train``."""
    p = sub.add_parser("train", help="warm start (cached) then asynchronous RL; writes a run directory")
    add_config_args(p)
    p.add_argument(
        "--run-dir",
        help="output directory (default runs/<timestamp>); one run per directory: one that already "
        "holds a run is refused unless --resume or --overwrite",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start a new run in --run-dir even if it holds one: the old run is moved aside to DIR.old-<timestamp> "
        "(never deleted)",
    )
    p.add_argument("--model", help="local Hugging Face model directory (default: the tiny warm-started model)")
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue RUN_DIR from its newest checkpoint (its config.yaml, then --config and --set on top); "
        "only the run's length, logging and checkpoint cadence may change unless --allow-change names a key",
    )
    p.add_argument(
        "--allow-change",
        action="append",
        default=[],
        metavar="KEY",
        help="with --resume: let this config key (or section, e.g. trainer) change from the run's saved config "
        "(repeatable or comma-separated); the keys that define the run (model, task, sft, seeds, group and "
        "batch size, staleness bound) never change",
    )
    p.add_argument(
        "--launcher",
        choices=get_args(LaunchKind),
        help="where the stages run (sets launch.kind; ray: engines, trainer ranks, reward workers as Ray actors)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Train (or ``--resume``) one run; the exit code is 128 + the signal for a run stopped by one."""
    if args.launcher:  # before validation: launch.kind decides which settings are valid
        args.overrides = [*args.overrides, f"launch.kind={args.launcher}"]
    if args.resume:
        if args.run_dir:
            raise RunDirError(
                f"--resume {args.resume} continues the run in that directory; --run-dir cannot be combined with it "
                "(to train on elsewhere, start a new run there: --model RUN_DIR/checkpoints/step-N --run-dir NEW_DIR)"
            )
        # the run's own resolved config, then --config and --set on top (e.g. more total_steps)
        saved = Path(args.resume) / "config.yaml"
        if not saved.is_file():
            raise FileNotFoundError(f"cannot resume: {saved} does not exist")
        cfg = load(args, base=saved)
        cfg = with_values(cfg, {"run.run_dir": args.resume})
    else:
        if args.allow_change:
            raise RunDirError("--allow-change only applies to --resume (a new run takes any settings)")
        cfg = load(args)
        if args.run_dir:
            cfg = with_values(cfg, {"run.run_dir": args.run_dir})
    if args.model:
        cfg = with_values(cfg, {"model.path": args.model})
    from asyncrl.launch.local import train

    allow = tuple(k.strip() for item in args.allow_change for k in item.split(",") if k.strip())
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # under torchrun: rank 0 runs the controller and leads the FSDP2 trainer, other ranks follow
        from asyncrl.trainer.distributed import run_distributed
        from asyncrl.trainer.trainer import Trainer

        cfg = with_values(cfg, {"controller.trainer_process": False})  # the trainer lives in the ranks' group
        result = run_distributed(
            lambda: train(cfg, resume=bool(args.resume), overwrite=args.overwrite, allow_change=allow),
            follower=Trainer.follower,  # how the other ranks build their trainers
            timeout_s=cfg.trainer.dist_timeout_s,
        )
        if result is None:
            return 0
        run_dir, summary = result
    else:
        run_dir, summary = train(cfg, resume=bool(args.resume), overwrite=args.overwrite, allow_change=allow)
    print(
        json.dumps(
            {
                k: summary[k]
                for k in (
                    "accuracy_before",
                    "accuracy_after",
                    "steps",
                    "wall_s",
                    "trained_tokens_per_s",
                    "max_staleness_seen",
                )
            },
            indent=2,
        )
    )
    print(f"run directory: {run_dir}")
    stop = summary.get("stop_reason")
    if stop:
        import signal

        return 128 + int(getattr(signal, stop, signal.SIGTERM))
    return 0
