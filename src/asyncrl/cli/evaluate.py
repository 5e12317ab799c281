"""``asyncrl eval``: held-out accuracy of a model on the configured task."""

from __future__ import annotations

import argparse
import json
from typing import Any

from asyncrl.cli.common import add_config_args, load
from asyncrl.config import with_values


def add_parser(sub: Any) -> None:
    """Register ``asyncrl eval``."""
    p = sub.add_parser("eval", help="held-out accuracy of a model on the configured task")
    add_config_args(p)
    p.add_argument("--model", help="local Hugging Face model directory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Held-out accuracy of ``--model`` (default: the warm-started tiny model)."""
    cfg = load(args)
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
