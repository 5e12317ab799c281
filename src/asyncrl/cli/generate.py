"""``asyncrl generate``: batch generation from a JSONL file of prompts, with log-probs and versions."""

from __future__ import annotations

import argparse
import json
from typing import Any

from asyncrl.config import RolloutConfig
from asyncrl.config.parse import finite_float


def add_parser(sub: Any) -> None:
    """Register ``asyncrl generate``."""
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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Generate from the input JSONL into the output JSONL; prints the summary."""
    from asyncrl.rollout.batch_generate import generate_batch

    summary = generate_batch(
        args.model,
        args.input,
        args.output,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        greedy=args.greedy,
        n=args.n,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        max_slots=args.max_slots,
        device=args.device,
    )
    print(json.dumps(summary, indent=2))
    return 0
