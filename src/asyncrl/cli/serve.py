"""``asyncrl serve engine|reward|training``: an engine (SGLang-native subset and the OpenAI-compatible door),
the reward service, or the Tinker-compatible training service (docs/tinker.md) over HTTP."""

from __future__ import annotations

import argparse
from typing import Any, get_args

from asyncrl.choices import InterruptMode, ToolFormat
from asyncrl.config import ConfigError, RewardConfig, RolloutConfig
from asyncrl.config.parse import finite_float


def add_parser(sub: Any) -> None:
    """Register ``asyncrl serve``."""
    p = sub.add_parser(
        "serve",
        help="serve an engine, the reward service or a Tinker-compatible training service over HTTP",
        description="Serve an engine (SGLang-native subset), the reward service, or a Tinker-compatible training "
        "service (point the official tinker client's base_url at it: docs/tinker.md) over HTTP. Loopback by default; "
        "beyond loopback an API key is required (a bearer token; prefer $ASYNCRL_API_KEY or --api-key-file to "
        "--api-key, which other users can read in the process list). There is no TLS: use a trusted network or "
        "a TLS proxy. Threat model: docs/security.md.",
    )
    p.add_argument("what", choices=["engine", "reward", "training"])
    p.add_argument("--model", help="engine, training: local Hugging Face model directory (training: the base model)")
    p.add_argument(
        "--model-name", help="training: the name clients pass as base_model (default: the --model path as given)"
    )
    p.add_argument("--root", default="tinker_runs", help="training: directory of training runs and checkpoints")
    p.add_argument("--host", default="127.0.0.1", help="bind address (loopback by default; others need an API key)")
    p.add_argument("--api-key", help="bearer token clients must send (default: $ASYNCRL_API_KEY; see docs/security.md)")
    p.add_argument("--api-key-file", help="read the API key from the first line of this file")
    p.add_argument(
        "--weights-root",
        help="engine: the only directory /update_weights_from_disk may load from (the trainer's "
        "trainer.weight_export_dir); without it, weight updates from disk are refused",
    )
    p.add_argument(
        "--port", type=int, default=None, help="engine default 30000; training 8000; reward default: any free port"
    )
    p.add_argument("--max-slots", type=int, default=RolloutConfig.max_slots)
    p.add_argument(
        "--max-seq-len",
        type=int,
        default=RolloutConfig.max_prompt_len + RolloutConfig.max_new_tokens,
        help="KV cache per slot, prompt + output tokens (default: rollout.max_prompt_len + rollout.max_new_tokens)",
    )
    p.add_argument("--interrupt-mode", choices=get_args(InterruptMode), default=RolloutConfig.interrupt_mode)
    p.add_argument(
        "--tool-format",
        choices=get_args(ToolFormat),
        default="hermes",
        help="engine: how /v1/chat/completions reads tool calls in model text (docs/agent.md, the door)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--workers", type=int, default=RewardConfig.num_workers, help="reward: worker processes")
    p.add_argument(
        "--timeout", type=finite_float, default=RewardConfig.timeout_s, help="reward: per-item timeout in seconds"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
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
                args.model,
                args.host,
                args.port if args.port is not None else 30000,
                max_slots=args.max_slots,
                max_seq_len=args.max_seq_len,
                interrupt_mode=args.interrupt_mode,
                device=args.device,
                api_key=api_key,
                weights_root=args.weights_root,
                tool_format=args.tool_format,
            )
        case "reward":
            from asyncrl.reward.remote import serve_reward

            serve_reward(
                args.host,
                args.port if args.port is not None else 0,
                num_workers=args.workers,
                timeout_s=args.timeout,
                api_key=api_key,
            )
        case "training":
            if not args.model:
                raise ConfigError("asyncrl serve training needs --model DIR (the base model clients train)")
            if api_key and not api_key.startswith("tml-"):
                raise ConfigError("the tinker client only sends API keys that begin with 'tml-': choose such a key")
            from asyncrl.service import EngineSpec, serve_training

            serve_training(
                {args.model_name or args.model: args.model},
                args.root,
                args.host,
                args.port if args.port is not None else 8000,
                api_key=api_key,
                engine=EngineSpec(max_slots=args.max_slots, max_seq_len=args.max_seq_len, device=args.device),
            )
        case other:
            raise ConfigError(f"unknown server {other!r}")
    return 0
