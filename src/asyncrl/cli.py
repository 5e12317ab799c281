"""The ``asyncrl`` command line: train | sft | eval | generate | bench | report | serve | check-config.

Every subcommand that takes a config accepts ``--config FILE`` and any number of
``--set key=value`` overrides (unknown keys are an error naming the valid ones). Heavy imports
happen inside each subcommand so ``asyncrl --help`` is instant.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from asyncrl.config import Config, ConfigError, dump_yaml, load_config


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config file (any subset of the config tree)")
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override one field, e.g. --set controller.max_staleness=0 (repeatable)",
    )  # fmt: skip


def _load(args: argparse.Namespace) -> Config:
    return load_config(args.config, args.overrides)


def cmd_train(args: argparse.Namespace) -> int:
    cfg = _load(args)
    if args.run_dir:
        cfg.run.run_dir = args.run_dir
    if args.model:
        cfg.model.path = args.model
    from asyncrl.launch.local import train

    run_dir, summary = train(cfg)
    print(json.dumps({k: summary[k] for k in (
        "accuracy_before", "accuracy_after", "steps", "wall_s", "trained_tokens_per_s", "max_staleness_seen"
    )}, indent=2))  # fmt: skip
    print(f"run directory: {run_dir}")
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    cfg = _load(args)
    from asyncrl.controller.warm_start import ensure_policy, run_warm_start

    if args.output:
        stats = run_warm_start(cfg, args.output)
        print(json.dumps(stats, indent=2))
        print(f"model directory: {args.output}")
    else:
        cfg.model.path = None
        print(f"model directory: {ensure_policy(cfg)}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    cfg = _load(args)
    if args.model:
        cfg.model.path = args.model
    import asyncio

    from asyncrl.controller.evaluate import evaluate
    from asyncrl.controller.scoring import make_score_fn
    from asyncrl.controller.warm_start import ensure_policy
    from asyncrl.data.prompts import build_task
    from asyncrl.models import load_policy, stop_token_ids
    from asyncrl.rollout.engine import LocalEngine

    model_dir = ensure_policy(cfg)
    model, tokenizer = load_policy(model_dir, device=cfg.model.device, dtype=cfg.model.dtype)
    _, held_out, _ = build_task(cfg.task, tokenizer)
    engine = LocalEngine(
        model,
        tokenizer,
        max_slots=cfg.rollout.max_slots,
        max_seq_len=cfg.eval.max_new_tokens + 512,
        device=cfg.model.device,
    )
    score = make_score_fn(cfg.task.verifier, tokenizer)
    try:
        result = asyncio.run(evaluate(
            engine, held_out, score, greedy=cfg.eval.greedy, temperature=cfg.rollout.temperature,
            max_new_tokens=cfg.eval.max_new_tokens, stop_token_ids=stop_token_ids(tokenizer, model),
        ))  # fmt: skip
    finally:
        engine.close()
    print(json.dumps({"model": str(model_dir), "n": len(held_out), **result}, indent=2))
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    cfg = _load(args)
    out = Path(args.output) if args.output else None
    if out:
        dump_yaml(cfg, out)
    else:
        import yaml

        from asyncrl.config import to_dict

        print(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asyncrl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="warm start (cached) then asynchronous RL; writes a run directory")
    _add_config_args(p)
    p.add_argument("--run-dir", help="output directory (default runs/<timestamp>)")
    p.add_argument("--model", help="local Hugging Face model directory (default: the tiny warm-started model)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("sft", help="build and warm-start the tiny default model (cached)")
    _add_config_args(p)
    p.add_argument("--output", help="write the model here instead of the cache")
    p.set_defaults(func=cmd_sft)

    p = sub.add_parser("eval", help="held-out accuracy of a model on the configured task")
    _add_config_args(p)
    p.add_argument("--model", help="local Hugging Face model directory")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("check-config", help="validate a config and print the resolved tree")
    _add_config_args(p)
    p.add_argument("--output", help="write the resolved YAML here")
    p.set_defaults(func=cmd_check_config)
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
    except KeyboardInterrupt:
        print("asyncrl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
