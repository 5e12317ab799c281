"""``asyncrl bench engine``: LocalEngine vs ``transformers`` ``generate`` on a long-tailed workload.

Owns the engine benchmark. Both sides get the same model, the same prompts and the same per-request
response lengths, drawn from a long-tailed distribution (many short answers, a few very long ones,
like a reasoning model's). Lengths are forced with per-request ``max_new_tokens`` and no stop token,
so both generate exactly the same number of useful tokens; both sample at temperature 1 (no top-k/p).

- LocalEngine: every request submitted at once; continuous batching over ``slots`` slots.
- transformers: the requests in submission order, in static batches of ``slots`` (left-padded),
  each batch run with ``generate`` until its longest request is done (a static batch cannot drop
  finished rows or admit new ones, so the other rows' extra tokens are waste).

Metrics per row: ``useful_tokens``, ``wall_s``, ``useful_tokens_per_s``, ``decode_steps`` and
``slot_utilisation`` = useful tokens / (slots x decode steps). Ratios: LocalEngine / transformers.
"""

from __future__ import annotations

import asyncio
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["run_engine_bench", "long_tailed_lengths"]

# (share of requests, min length, max length): many short answers, a few very long ones.
DEFAULT_MIX = ((0.70, 4, 32), (0.25, 32, 96), (0.05, 128, 256))


def long_tailed_lengths(n: int, rng: random.Random, mix: tuple = DEFAULT_MIX) -> list[int]:
    """n response lengths from a mixture of uniform ranges (see ``DEFAULT_MIX``)."""
    out = []
    for _ in range(n):
        r, acc = rng.random(), 0.0
        bucket = mix[-1]
        for b in mix:
            acc += b[0]
            if r <= acc:
                bucket = b
                break
        out.append(rng.randint(bucket[1], bucket[2]))
    return out


def _prompts(tokenizer: Any, n: int, rng: random.Random) -> list[list[int]]:
    texts = [f"Q:{rng.randint(0, 10 ** rng.randint(1, 6))}+{rng.randint(0, 999)}=?\nA:" for _ in range(n)]
    return [list(tokenizer(t)["input_ids"]) for t in texts]


def _run_local(model: Any, tokenizer: Any, prompts, lengths, slots: int, max_seq_len: int) -> dict[str, Any]:
    from asyncrl.rollout.engine import LocalEngine
    from asyncrl.rollout.sampling import SamplingParams

    eng = LocalEngine(model, tokenizer, max_slots=slots, max_seq_len=max_seq_len)
    try:

        async def go() -> list:
            jobs = [
                eng.generate(p, SamplingParams(max_new_tokens=n, temperature=1.0, seed=i))
                for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
            ]
            return await asyncio.gather(*jobs)

        # Warm up (first-call allocations), then measure on fresh counters.
        asyncio.run(eng.generate(prompts[0], SamplingParams(max_new_tokens=4)))
        before = eng.stats()
        t0 = time.perf_counter()
        outs = asyncio.run(go())
        wall = time.perf_counter() - t0
        st = eng.stats()
    finally:
        eng.close()
    useful = sum(len(o[0].output_ids) for o in outs)
    steps = st["decode_steps"] - before["decode_steps"]
    return {
        "engine": "LocalEngine",
        "slots": slots,
        "requests": len(prompts),
        "useful_tokens": useful,
        "wall_s": round(wall, 3),
        "useful_tokens_per_s": round(useful / wall, 1),
        "decode_steps": int(steps),
        "slot_utilisation": round(useful / (slots * steps), 4),
        "prefill_s": round(st["prefill_s"] - before["prefill_s"], 3),
    }


def _run_hf(model: Any, tokenizer: Any, prompts, lengths, slots: int) -> dict[str, Any]:
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    t0 = time.perf_counter()
    steps = 0
    for start in range(0, len(prompts), slots):
        batch = prompts[start : start + slots]
        budget = max(lengths[start : start + slots])
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for b, p in enumerate(batch):  # left padding, as generate wants for decoder-only models
            ids[b, width - len(p) :] = torch.tensor(p)
            mask[b, width - len(p) :] = 1
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=budget,
                min_new_tokens=budget,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                pad_token_id=pad,
                eos_token_id=None,
            )
        assert out.shape[1] == width + budget
        steps += budget
    wall = time.perf_counter() - t0
    useful = sum(lengths)
    return {
        "engine": "transformers_generate",
        "slots": slots,
        "requests": len(prompts),
        "useful_tokens": useful,
        "wall_s": round(wall, 3),
        "useful_tokens_per_s": round(useful / wall, 1),
        "decode_steps": steps,
        "slot_utilisation": round(useful / (slots * steps), 4),
    }


def run_engine_bench(
    json_path: str | None = None,
    *,
    model_dir: str | None = None,
    num_requests: int = 1500,
    slots: int = 32,
    max_seq_len: int = 320,
    seed: int = 0,
    print_table: bool = True,
) -> dict[str, Any]:
    """Run both engines on the same long-tailed workload; print a table; write ``{"rows", "ratios"}``.

    ``model_dir``: a local HF checkpoint (default: the tiny policy, built in a temp dir)."""
    import torch

    from asyncrl.models import build_tiny_policy, load_policy

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(model_dir) if model_dir else build_tiny_policy(Path(tmp) / "tiny")
        model, tokenizer = load_policy(path)
        ref_model, _ = load_policy(path)
    rng = random.Random(seed)
    prompts = _prompts(tokenizer, num_requests, rng)
    lengths = long_tailed_lengths(num_requests, rng)
    longest = max(len(p) for p in prompts) + max(lengths)
    if longest > max_seq_len:
        max_seq_len = longest
    local = _run_local(model, tokenizer, prompts, lengths, slots, max_seq_len)
    hf = _run_hf(ref_model, tokenizer, prompts, lengths, slots)
    rows = [local, hf]
    ratios = {
        "useful_tokens_per_s": round(local["useful_tokens_per_s"] / hf["useful_tokens_per_s"], 2),
        "slot_utilisation": round(local["slot_utilisation"] / hf["slot_utilisation"], 2),
    }
    lengths_sorted = sorted(lengths)
    result = {
        "rows": rows,
        "ratios": ratios,
        "workload": {
            "requests": num_requests,
            "slots": slots,
            "mean_len": round(sum(lengths) / len(lengths), 1),
            "p50_len": lengths_sorted[len(lengths) // 2],
            "p99_len": lengths_sorted[int(len(lengths) * 0.99)],
            "max_len": lengths_sorted[-1],
            "torch_threads": torch.get_num_threads(),
        },
    }
    if print_table:
        print(format_table(result))
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2) + "\n")
    return result


def format_table(result: dict[str, Any]) -> str:
    cols = ("engine", "useful_tokens", "wall_s", "useful_tokens_per_s", "decode_steps", "slot_utilisation")
    lines = ["  ".join(f"{c:>22}" for c in cols)]
    for row in result["rows"]:
        lines.append("  ".join(f"{row[c]!s:>22}" for c in cols))
    w = result["workload"]
    lines.append(
        f"workload: {w['requests']} requests, {w['slots']} slots, response length mean {w['mean_len']} "
        f"p50 {w['p50_len']} p99 {w['p99_len']} max {w['max_len']}; torch threads {w['torch_threads']}"
    )
    r = result["ratios"]
    lines.append(
        f"LocalEngine / transformers: useful tokens/s x{r['useful_tokens_per_s']}, "
        f"slot utilisation x{r['slot_utilisation']}"
    )
    return "\n".join(lines)
