"""``python -m benchmarks decode``: LocalEngine's decode throughput by sequences running x context length.

Owns the occupancy sweep. For each context length C and each number of sequences N, one request of
N samples of a C-token prompt (one prefill, its KV copied into N slots) decodes ``new_tokens``
tokens per sample (no stop token), so N sequences run together from the first decode step to the
last; the row's throughput is the engine's own ``decode_tokens / decode_s`` over that batch
(prefill excluded). One torch thread by default: on the 2-core machine the engine gets one core
while the trainer has the other.

Why it matters: on a CPU a decode step's cost grows with the sequences running *and* with their
contexts (attention reads every sequence's own K/V), so at long contexts a full engine is not much
faster than a quarter-full one (measured: docs/engine.md §9). On a GPU, at small model sizes, a
step's cost is mostly reading the weights once, whatever the batch (not measured here: no GPU).
That bounds the gain of asynchrony on the generation-bound workload of ``bench async --workload
long`` on this machine (docs/controller.md §5.2).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from asyncrl.config import ConfigError
from asyncrl.results import write_text_result
from benchmarks.options import add_json, parse_list

__all__ = ["add_arguments", "run", "run_decode_sweep"]


def _sweep_one(engine: Any, context: int, running: int, new_tokens: int, token_id: int) -> dict[str, Any]:
    from asyncrl.rollout.sampling import SamplingParams

    sampling = SamplingParams(max_new_tokens=new_tokens, seed=context * 1000 + running)
    before = engine.stats()
    outs = asyncio.run(engine.generate([token_id] * context, sampling, running))
    after = engine.stats()
    tokens = after["decode_tokens"] - before["decode_tokens"]
    seconds = after["decode_s"] - before["decode_s"]
    generated = sum(len(c.output_ids) for c in outs)
    return {
        "context": context,
        "running": running,
        "new_tokens": new_tokens,
        "generated_tokens": generated,
        "decode_tokens": tokens,
        "decode_s": seconds,
        "decode_tokens_per_s": tokens / max(seconds, 1e-9),
    }


def run_decode_sweep(
    json_path: str | None = None,
    *,
    model_dir: str | None = None,
    contexts: tuple[int, ...] = (50, 600, 1200),
    running: tuple[int, ...] = (1, 4, 16, 64, 128),
    new_tokens: int = 150,
    threads: int | None = 1,
    print_table: bool = True,
) -> dict[str, Any]:
    """Decode tokens/s of ``LocalEngine`` for every (context, running) pair; prints a table (rows:
    context, columns: sequences running) and writes ``{"rows", "table", ...}`` to ``json_path``.
    ``model_dir``: a local HF checkpoint (default: the tiny policy, built in a temp dir)."""
    import torch

    from asyncrl.models import build_tiny_policy, load_policy
    from asyncrl.rollout.engine import LocalEngine

    if not contexts or not running or min(contexts) < 1 or min(running) < 1 or new_tokens < 1:
        raise ValueError("contexts, running and new_tokens must be positive")
    prev_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(model_dir) if model_dir else build_tiny_policy(Path(tmp) / "tiny")
        model, tokenizer = load_policy(path)
    token_id = int(tokenizer("1")["input_ids"][-1])
    engine = LocalEngine(model, tokenizer, max_slots=max(running), max_seq_len=max(contexts) + new_tokens + 1)
    rows = []
    try:
        _sweep_one(engine, min(contexts), 1, 2, token_id)  # start the thread, warm the kernels
        for context in contexts:
            for n in running:
                row = _sweep_one(engine, context, n, new_tokens, token_id)
                rows.append(row)
                if print_table:
                    print(
                        f"context {context:5d}  running {n:4d}: {row['decode_tokens_per_s']:8.0f} decode tok/s",
                        flush=True,
                    )
    finally:
        engine.close()
        torch.set_num_threads(prev_threads)
    table = {
        f"{c}-{c + new_tokens}": {str(r["running"]): round(r["decode_tokens_per_s"]) for r in rows if r["context"] == c}
        for c in contexts
    }
    result = {
        "bench": "decode",
        "rows": rows,
        "table": table,
        "new_tokens": new_tokens,
        "torch_threads": threads if threads is not None else prev_threads,
        "model_dir": str(model_dir) if model_dir else "tiny policy (random init)",
    }
    if print_table:
        head = "| context | " + " | ".join(str(n) for n in running) + " |"
        print("\ndecode tokens/s by sequences running (one thread)\n" + head)
        print("|" + "---|" * (len(running) + 1))
        for label, cells in table.items():
            print(f"| {label} | " + " | ".join(str(cells[str(n)]) for n in running) + " |")
    if json_path:
        write_text_result(json_path, json.dumps(result, indent=2) + "\n")  # never over a file (asyncrl.results)
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json``, ``--model``, ``--contexts``, ``--running``."""
    add_json(parser)
    parser.add_argument("--model", help="model directory (default: the tiny model, built here)")
    parser.add_argument("--contexts", help="comma-separated prompt lengths (default 50,600,1200)")
    parser.add_argument("--running", help="comma-separated numbers of sequences running (default 1,4,16,64,128)")


def run(args: argparse.Namespace) -> None:
    """The decode sweep at the sizes given (the function's defaults otherwise)."""
    sizes = {}
    if args.contexts:
        sizes["contexts"] = parse_list(args.contexts, int, (), "--contexts")
    if args.running:
        sizes["running"] = parse_list(args.running, int, (), "--running")
    try:
        run_decode_sweep(args.json, model_dir=args.model, **sizes)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
