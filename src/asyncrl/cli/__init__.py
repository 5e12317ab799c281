"""The ``asyncrl`` command line: train | sft | eval | generate | serve | simulate | plan | report | check-config.

The benchmarks are not part of the product: ``python -m benchmarks NAME`` from a checkout (``benchmarks/``).

Every subcommand that takes a config accepts ``--config FILE`` and any number of
``--set key=value`` overrides (unknown keys are an error naming the valid ones). Heavy imports
happen inside each subcommand so ``asyncrl --help`` is instant.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import get_args

from asyncrl.choices import InterruptMode, LaunchKind, ToolFormat
from asyncrl.cli_errors import known_error
from asyncrl.config import Config, ConfigError, RewardConfig, RolloutConfig, dump_yaml, load_config, with_values
from asyncrl.config.parse import finite_float
from asyncrl.controller.rundir import RunDirError
from asyncrl.launch import RunStopped


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config file (any subset of the config tree)")
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override one field, e.g. --set controller.max_staleness=0 (repeatable)",
    )  # fmt: skip


def _load(args: argparse.Namespace, base: Path | None = None) -> Config:
    """The config of ``--config`` and ``--set`` (layered over ``base``: a resumed run's saved config);
    this process's torch threads are set from it (``run.torch_threads``)."""
    from asyncrl.launch.stages import configure_threads

    cfg = load_config(args.config, args.overrides, base=base)
    configure_threads(cfg)
    return cfg


def cmd_train(args: argparse.Namespace) -> int:
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
        cfg = _load(args, base=saved)
        cfg = with_values(cfg, {"run.run_dir": args.resume})
    else:
        if args.allow_change:
            raise RunDirError("--allow-change only applies to --resume (a new run takes any settings)")
        cfg = _load(args)
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
    print(json.dumps({k: summary[k] for k in (
        "accuracy_before", "accuracy_after", "steps", "wall_s", "trained_tokens_per_s", "max_staleness_seen"
    )}, indent=2))  # fmt: skip
    print(f"run directory: {run_dir}")
    stop = summary.get("stop_reason")
    if stop:
        import signal

        return 128 + int(getattr(signal, stop, signal.SIGTERM))
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    cfg = _load(args)
    from asyncrl.launch.warm_start import ensure_policy, run_warm_start

    if args.output:
        stats = run_warm_start(cfg, args.output)
        print(json.dumps(stats, indent=2))
        print(f"model directory: {args.output}")
    else:
        print(f"model directory: {ensure_policy(with_values(cfg, {'model.path': None}))}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    cfg = _load(args)
    if args.model:
        cfg = with_values(cfg, {"model.path": args.model})
    import asyncio

    from asyncrl.data.prompts import build_task, drop_long_prompts
    from asyncrl.launch.stages import build_engine, evaluate_once, load_model
    from asyncrl.launch.warm_start import ensure_policy
    from asyncrl.models import stop_token_ids

    model_dir = ensure_policy(cfg)
    model, tokenizer = load_model(cfg, model_dir)
    _, held_out, _ = build_task(cfg.task, tokenizer)
    held_out = drop_long_prompts(held_out, cfg.rollout.max_prompt_len, "held-out prompts")
    engine = build_engine(cfg, model, tokenizer)  # the training run's engine, evaluated as its run does
    try:
        result = asyncio.run(evaluate_once(cfg, engine, held_out, tokenizer, stop_token_ids(tokenizer, model)))
    finally:
        engine.close()
    print(json.dumps({"model": str(model_dir), "n": len(held_out), **result}, indent=2))
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from asyncrl.rollout.batch_generate import generate_batch

    summary = generate_batch(
        args.model, args.input, args.output, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        greedy=args.greedy, n=args.n, top_p=args.top_p, top_k=args.top_k, seed=args.seed, max_slots=args.max_slots,
        device=args.device,
    )  # fmt: skip
    print(json.dumps(summary, indent=2))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from asyncrl.auth import check_bind, resolve_api_key

    try:
        api_key = resolve_api_key(args.api_key, args.api_key_file)
        check_bind(args.host, bool(api_key), f"{args.what} server")
    except ValueError as exc:  # InsecureBindError included
        raise ConfigError(str(exc)) from exc
    match args.what:
        case "engine":
            if not args.model:
                raise ConfigError("asyncrl serve engine needs --model DIR")
            from asyncrl.rollout.server import serve_engine

            serve_engine(
                args.model, args.host, args.port if args.port is not None else 30000, max_slots=args.max_slots,
                max_seq_len=args.max_seq_len, interrupt_mode=args.interrupt_mode, device=args.device,
                api_key=api_key, weights_root=args.weights_root, tool_format=args.tool_format,
            )  # fmt: skip
        case "reward":
            from asyncrl.reward.remote import serve_reward

            serve_reward(args.host, args.port if args.port is not None else 0, num_workers=args.workers,
                         timeout_s=args.timeout, api_key=api_key)  # fmt: skip
        case other:
            raise ConfigError(f"unknown server {other!r}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from asyncrl.controller.report import make_report

    for path in make_report(args.run_dir, args.output):
        print(path)
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
    p.add_argument(
        "--run-dir", help="output directory (default runs/<timestamp>); one run per directory: one that already "
        "holds a run is refused unless --resume or --overwrite",
    )  # fmt: skip
    p.add_argument(
        "--overwrite", action="store_true",
        help="start a new run in --run-dir even if it holds one: the old run is moved aside to DIR.old-<timestamp> "
        "(never deleted)",
    )  # fmt: skip
    p.add_argument("--model", help="local Hugging Face model directory (default: the tiny warm-started model)")
    p.add_argument(
        "--resume", metavar="RUN_DIR",
        help="continue RUN_DIR from its newest checkpoint (its config.yaml, then --config and --set on top); "
        "only the run's length, logging and checkpoint cadence may change unless --allow-change names a key",
    )  # fmt: skip
    p.add_argument(
        "--allow-change", action="append", default=[], metavar="KEY",
        help="with --resume: let this config key (or section, e.g. trainer) change from the run's saved config "
        "(repeatable or comma-separated); the keys that define the run (model, task, sft, seeds, group and "
        "batch size, staleness bound) never change",
    )  # fmt: skip
    p.add_argument(
        "--launcher", choices=get_args(LaunchKind),
        help="where the stages run (sets launch.kind; ray: engines, trainer ranks, reward workers as Ray actors)",
    )  # fmt: skip
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("sft", help="build and warm-start the tiny default model (cached)")
    _add_config_args(p)
    p.add_argument("--output", help="write the model here instead of the cache")
    p.set_defaults(func=cmd_sft)

    p = sub.add_parser("eval", help="held-out accuracy of a model on the configured task")
    _add_config_args(p)
    p.add_argument("--model", help="local Hugging Face model directory")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("generate", help="batch generation from a JSONL file of prompts")
    p.add_argument("--model", required=True, help="local Hugging Face model directory")
    p.add_argument("--input", required=True, help="JSONL rows with `prompt` (text) or `input_ids`")
    p.add_argument("--output", required=True, help="JSONL output: id, output_ids, text, logprobs, versions, ...")
    p.add_argument("--max-new-tokens", type=int, default=RolloutConfig.max_new_tokens)
    p.add_argument("--temperature", type=finite_float, default=1.0)
    p.add_argument("--greedy", action="store_true")
    p.add_argument("--n", type=int, default=1, help="samples per prompt")
    p.add_argument("--top-p", type=finite_float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-slots", type=int, default=RolloutConfig.max_slots)
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser(
        "serve", help="serve an engine (SGLang-native subset) or the reward service over HTTP",
        description="Serve an engine (SGLang-native subset) or the reward service over HTTP. Loopback by default; "
        "beyond loopback an API key is required (a bearer token; prefer $ASYNCRL_API_KEY or --api-key-file to "
        "--api-key, which other users can read in the process list). There is no TLS: use a trusted network or "
        "a TLS proxy. Threat model: docs/security.md.",
    )  # fmt: skip
    p.add_argument("what", choices=["engine", "reward"])
    p.add_argument("--model", help="engine: local Hugging Face model directory")
    p.add_argument("--host", default="127.0.0.1", help="bind address (loopback by default; others need an API key)")
    p.add_argument("--api-key", help="bearer token clients must send (default: $ASYNCRL_API_KEY; see docs/security.md)")
    p.add_argument("--api-key-file", help="read the API key from the first line of this file")
    p.add_argument(
        "--weights-root", help="engine: the only directory /update_weights_from_disk may load from (the trainer's "
        "trainer.weight_export_dir); without it, weight updates from disk are refused",
    )  # fmt: skip
    p.add_argument("--port", type=int, default=None, help="engine default 30000; reward default: any free port")
    p.add_argument("--max-slots", type=int, default=RolloutConfig.max_slots)
    p.add_argument(
        "--max-seq-len", type=int, default=RolloutConfig.max_prompt_len + RolloutConfig.max_new_tokens,
        help="KV cache per slot, prompt + output tokens (default: rollout.max_prompt_len + rollout.max_new_tokens)",
    )  # fmt: skip
    p.add_argument("--interrupt-mode", choices=get_args(InterruptMode), default=RolloutConfig.interrupt_mode)
    p.add_argument(
        "--tool-format", choices=get_args(ToolFormat), default="hermes",
        help="engine: how /v1/chat/completions reads tool calls in model text (docs/agent.md, the door)",
    )  # fmt: skip
    p.add_argument("--device", default="cpu")
    p.add_argument("--workers", type=int, default=RewardConfig.num_workers, help="reward: worker processes")
    p.add_argument(
        "--timeout", type=finite_float, default=RewardConfig.timeout_s, help="reward: per-item timeout in seconds"
    )
    p.set_defaults(func=cmd_serve)

    from asyncrl.sim.command import add_simulate_parser  # its flags live beside the simulator

    add_simulate_parser(sub)

    from asyncrl.sim.plan_command import add_plan_parser

    add_plan_parser(sub)

    p = sub.add_parser("report", help="PNG plots of a run directory (reward, throughput, staleness, timeline)")
    p.add_argument("run_dir")
    p.add_argument("--output", help="directory for the plots (default RUN_DIR/plots)")
    p.set_defaults(func=cmd_report)

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
