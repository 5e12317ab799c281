"""``python -m benchmarks engine``: LocalEngine vs ``transformers`` ``generate`` on a long-tailed workload.

Owns the engine benchmark and its command (``add_arguments``, ``run``). Both sides get the same model, the
same prompts and the same per-request response lengths, drawn from a long-tailed distribution (many short
answers, a few very long ones, like a reasoning model's). Lengths are forced with per-request
``max_new_tokens`` and no stop token, so both generate exactly the same number of useful tokens; both sample
at temperature 1 (no top-k/p).

- LocalEngine: every request submitted at once; continuous batching over ``slots`` slots.
- transformers: the requests in submission order, in static batches of ``slots`` (left-padded),
  each batch run with ``generate`` until its longest request is done (a static batch cannot drop
  finished rows or admit new ones, so the other rows' extra tokens are waste).

Metrics per row: ``useful_tokens``, ``wall_s``, ``useful_tokens_per_s``, ``decode_steps`` and
``slot_utilisation`` = useful tokens / (slots x decode steps). Ratios: LocalEngine / transformers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from asyncrl.config import ConfigError
from asyncrl.results import write_text_result
from benchmarks.options import add_json

__all__ = ["add_arguments", "long_tailed_lengths", "run", "run_engine_bench", "run_interrupt_cost"]

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


def _run_hf(model: Any, tokenizer: Any, prompts, lengths, slots: int, label: str) -> dict[str, Any]:
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
        "engine": label,
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
    threads: int | None = 1,
    hf_sdpa: bool = False,
    print_table: bool = True,
) -> dict[str, Any]:
    """Run both engines on the same long-tailed workload; print a table; write ``{"rows", "ratios"}``.

    ``model_dir``: a local HF checkpoint (default: the tiny policy, built in a temp dir).
    ``threads``: torch intra-op threads for both sides (default 1: on a 2-core machine the engine
    shares the cores with the trainer; two OpenMP threads also slow ``generate`` down by ~50x on
    an oversubscribed VM, which would inflate the ratio). ``None`` keeps torch's setting.
    ``hf_sdpa``: add a row for ``generate`` with SDPA attention (the ratio stays against the
    model as ``load_policy`` loads it: eager attention)."""
    import torch

    prev_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _bench(json_path, model_dir, num_requests, slots, max_seq_len, seed, hf_sdpa, print_table)
    finally:
        torch.set_num_threads(prev_threads)


def _bench(json_path, model_dir, num_requests, slots, max_seq_len, seed, hf_sdpa, print_table) -> dict[str, Any]:
    import torch

    from asyncrl.models import build_tiny_policy, load_policy

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(model_dir) if model_dir else build_tiny_policy(Path(tmp) / "tiny")
        model, tokenizer = load_policy(path)
        ref_model, _ = load_policy(path)
        sdpa_model = None
        if hf_sdpa:
            from transformers import AutoModelForCausalLM

            sdpa_model = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="sdpa").eval()
    rng = random.Random(seed)
    prompts = _prompts(tokenizer, num_requests, rng)
    lengths = long_tailed_lengths(num_requests, rng)
    longest = max(len(p) for p in prompts) + max(lengths)
    if longest > max_seq_len:
        max_seq_len = longest
    local = _run_local(model, tokenizer, prompts, lengths, slots, max_seq_len)
    hf = _run_hf(ref_model, tokenizer, prompts, lengths, slots, "transformers_generate")
    rows = [local, hf]
    if sdpa_model is not None:
        rows.append(_run_hf(sdpa_model, tokenizer, prompts, lengths, slots, "transformers_generate_sdpa"))
    ratios = {
        "useful_tokens_per_s": round(local["useful_tokens_per_s"] / hf["useful_tokens_per_s"], 2),
        "slot_utilisation": round(local["slot_utilisation"] / hf["slot_utilisation"], 2),
    }
    if sdpa_model is not None:
        ratios["useful_tokens_per_s_vs_sdpa"] = round(local["useful_tokens_per_s"] / rows[2]["useful_tokens_per_s"], 2)
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
        write_text_result(json_path, json.dumps(result, indent=2) + "\n")  # never over a file (asyncrl.results)
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
        + (f"; vs generate with SDPA attention x{r['useful_tokens_per_s_vs_sdpa']}" if len(result["rows"]) > 2 else "")
    )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Cost of in-flight weight updates: abort (re-prefill) vs keep (stale KV)


def run_interrupt_cost(
    json_path: str | None = None,
    *,
    model_dir: str | None = None,
    num_prompts: int = 96,
    group_size: int = 4,
    slots: int = 32,
    update_every_steps: int = 25,
    weight_noise: float = 0.01,
    check_samples: int = 24,
    seed: int = 0,
    print_table: bool = True,
) -> dict[str, Any]:
    """The same long-tailed workload of groups with a weight update every ``update_every_steps``
    decode steps, in ``abort`` and ``keep`` mode, plus a no-update baseline.

    Reports per mode: wall time and useful tokens/s; ``reprefill_tokens`` (prompt + partial output
    tokens prefilled again after aborts: abort's cost); ``stale_kv_tokens`` (tokens sampled with part
    of their context's KV computed by older weights: keep's change) and the log-prob gap between
    the engine's behaviour log-prob and a fresh forward under the token's own version (mean/max
    over ``check_samples`` samples). Each update adds ``weight_noise`` x (tensor std) Gaussian noise to
    every weight (a stand-in for one optimizer step)."""
    import torch

    from asyncrl.models import build_tiny_policy, load_policy
    from asyncrl.rollout.engine import LocalEngine
    from asyncrl.rollout.interruptible import generate_group
    from asyncrl.rollout.sampling import SamplingParams
    from asyncrl.types import WeightUpdate

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(model_dir) if model_dir else build_tiny_policy(Path(tmp) / "tiny")
        base_model, tokenizer = load_policy(path)
        ref_model, _ = load_policy(path)
        models = {mode: load_policy(path)[0] for mode in ("none", "abort", "keep")}
    rng = random.Random(seed)
    prompts = _prompts(tokenizer, num_prompts, rng)
    lengths = long_tailed_lengths(num_prompts, rng)
    base = {k: v.clone() for k, v in base_model.state_dict().items()}
    gen = torch.Generator().manual_seed(seed)
    states = [base]

    def state(v: int) -> dict[str, torch.Tensor]:
        while len(states) <= v:
            prev = states[-1]
            states.append(
                {k: t + weight_noise * t.std() * torch.randn(t.shape, generator=gen) for k, t in prev.items()}
            )
        return states[v]

    max_len = max(len(p) for p in prompts) + max(lengths)
    rows = []
    samples: dict[str, list] = {}
    for mode in ("none", "abort", "keep"):
        eng = LocalEngine(
            models[mode],
            tokenizer,
            max_slots=slots,
            max_seq_len=max_len,
            interrupt_mode="keep" if mode == "none" else mode,
        )

        async def go(eng: LocalEngine = eng, mode: str = mode) -> tuple[list, int]:
            jobs = [
                asyncio.ensure_future(
                    generate_group(eng, p, SamplingParams(max_new_tokens=n, seed=1000 * i), group_size)
                )
                for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
            ]
            version = 0
            while mode != "none" and not all(j.done() for j in jobs):
                mark = eng.stats()["decode_steps"]
                while eng.stats()["decode_steps"] < mark + update_every_steps and not all(j.done() for j in jobs):
                    await asyncio.sleep(0.005)
                if all(j.done() for j in jobs):
                    break
                version += 1
                update = {k: t.clone() for k, t in state(version).items()}
                await eng.update_weights(WeightUpdate(version=version, tensors=update))
            return await asyncio.gather(*jobs), version

        t0 = time.perf_counter()
        try:
            groups, updates = asyncio.run(go())
        finally:
            eng.close()
        wall = time.perf_counter() - t0
        st = eng.stats()
        comps = [c for g in groups for c in g]
        useful = sum(len(c.output_ids) for c in comps)
        first_prefill = sum(len(p) for p in prompts)
        stale = sum(sum(1 for v in c.versions if v != c.versions[0]) for c in comps) if mode == "keep" else 0
        samples[mode] = comps
        rows.append(
            {
                "mode": mode,
                "weight_updates": updates,
                "useful_tokens": useful,
                "wall_s": round(wall, 3),
                "useful_tokens_per_s": round(useful / wall, 1),
                "prefill_tokens": int(st["prefill_tokens"]),
                "reprefill_tokens": int(st["prefill_tokens"] - first_prefill),
                "reprefill_per_useful_token": round((st["prefill_tokens"] - first_prefill) / useful, 4),
                "interrupted_samples": sum(1 for c in comps if c.num_interruptions),
                "mean_interruptions": round(sum(c.num_interruptions for c in comps) / len(comps), 3),
                "stale_kv_tokens": stale,
                "stale_kv_fraction": round(stale / useful, 4),
                "decode_steps": int(st["decode_steps"]),
                "slot_utilisation": round(st["slot_utilisation"], 4),
                "prefill_s": round(st["prefill_s"], 3),
                "decode_s": round(st["decode_s"], 3),
                "update_s": round(st["update_s"], 3),
            }
        )

    # What each mode changes: behaviour log-prob vs a fresh forward under the token's own version.
    prompt_of = {}
    for p in prompts:
        prompt_of.setdefault(tuple(p), p)
    for row in rows:
        comps = [c for c in samples[row["mode"]] if len(set(c.versions)) > 1][:check_samples]
        gaps: list[float] = []
        with torch.no_grad():
            for c in comps:
                ids = torch.tensor([list(c.prompt_ids) + list(c.output_ids)])
                for v in sorted(set(c.versions)):
                    ref_model.load_state_dict(state(v))
                    lp = torch.log_softmax(ref_model(ids).logits[0, len(c.prompt_ids) - 1 : -1], -1)
                    lp = lp.gather(1, torch.tensor(c.output_ids)[:, None])[:, 0]
                    gaps += [abs(lp[t].item() - c.behav_logprobs[t]) for t, vt in enumerate(c.versions) if vt == v]
        row["checked_samples"] = len(comps)
        row["logprob_gap_mean"] = round(sum(gaps) / len(gaps), 6) if gaps else 0.0
        row["logprob_gap_max"] = round(max(gaps), 6) if gaps else 0.0
    none_tps = rows[0]["useful_tokens_per_s"]
    result = {
        "rows": rows,
        "ratios": {f"{r['mode']}_tokens_per_s_vs_none": round(r["useful_tokens_per_s"] / none_tps, 3) for r in rows},
        "workload": {
            "prompts": num_prompts,
            "group_size": group_size,
            "slots": slots,
            "update_every_steps": update_every_steps,
            "weight_noise": weight_noise,
            "mean_len": round(sum(lengths) / len(lengths), 1),
        },
    }
    if print_table:
        cols = (
            "mode",
            "weight_updates",
            "useful_tokens_per_s",
            "reprefill_tokens",
            "reprefill_per_useful_token",
            "stale_kv_fraction",
            "logprob_gap_mean",
            "logprob_gap_max",
        )
        print("  ".join(f"{c:>18}" for c in cols))
        for r in rows:
            print("  ".join(f"{r[c]!s:>18}" for c in cols))
    if json_path:
        write_text_result(json_path, json.dumps(result, indent=2) + "\n")  # never over a file (asyncrl.results)
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json``, ``--model``, ``--requests``."""
    add_json(parser)
    parser.add_argument("--model", help="model directory (default: the tiny model, built here)")
    parser.add_argument(
        "--requests", type=int, default=1500, help="requests of the workload, both sides (default %(default)s)"
    )


def run(args: argparse.Namespace) -> None:
    """The engine benchmark on ``--model`` with ``--requests`` requests."""
    if args.requests < 1:
        raise ConfigError(f"--requests must be >= 1, got {args.requests}")
    run_engine_bench(args.json, model_dir=args.model, num_requests=args.requests)
