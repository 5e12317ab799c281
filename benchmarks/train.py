"""``python -m benchmarks train``: packed dynamic micro-batching vs two padded baselines.

Owns the training-throughput benchmark and its command (``add_arguments``, ``run``). Both sides run the real
``Trainer.train_step`` (proximal log-prob pass, forward/backward of the decoupled PPO loss, clipping, AdamW)
on the same samples, from the same weights, one thread each, interleaved step by step so background load hits
both:

- packed: padding-free streams under ``max_tokens_per_micro_batch`` tokens, first-fit-decreasing
  bins, attention per sequence (``trainer.attention``);
- padded: micro-batches of a fixed number of sequences in batch order, right-padded to the
  longest in the micro-batch (masked SDPA attention). The headline padded size is the one that
  fits the same activation budget: ``max_tokens_per_micro_batch // longest sequence`` sequences
  (a fixed-size padded micro-batch must be sized for its worst case); other sizes are rows too.
- padded_grouped: the same fixed-size micro-batches over the batch sorted by length (sorted
  buckets, what a length-grouped sampler such as HF Trainer's ``group_by_length`` gives), so
  sequences of similar length pad together; every size is a row, and the best one is the
  baseline packing has to beat.

Samples are prompts of 8-24 tokens followed by responses with a long-tailed length distribution
(``benchmarks.engine.DEFAULT_MIX``: many short answers, a few very long ones). Models: the default tiny
policy and a ~20 M-parameter one of the same architecture (random init: speed does not depend on
the weights).

Metrics per row: ``trained_tokens_per_s`` (real tokens of the batch / step wall time, median of
the timed steps), ``step_time_s``, ``computed_tokens`` (tokens the model ran on, pads included),
``padding_frac``, ``micro_batches``. Ratios per model: packed / padded at the same budget, packed /
best padded (batch order), packed / best length-grouped padded.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from asyncrl.config import ConfigError
from asyncrl.results import write_text_result
from benchmarks.options import add_json

__all__ = ["MODELS", "add_arguments", "bench_samples", "run", "run_train_bench"]

# name -> TinyModelSpec overrides (None: the default tiny policy)
MODELS: dict[str, dict[str, int] | None] = {
    "tiny": None,
    "20m": {"hidden_size": 512, "num_layers": 6, "num_heads": 8, "num_kv_heads": 4, "intermediate_size": 1536},
}


def bench_samples(n: int, seed: int = 0, vocab: tuple[int, int] = (4, 90)) -> list[Any]:
    """``n`` training samples with long-tailed response lengths (behaviour log-probs synthetic)."""
    from asyncrl.types import TrainSample
    from benchmarks.engine import long_tailed_lengths

    rng = random.Random(seed)
    responses = long_tailed_lengths(n, rng)
    out = []
    for i, resp in enumerate(responses):
        prompt = rng.randint(8, 24)
        ids = tuple(rng.randrange(*vocab) for _ in range(prompt + resp))
        mask = (0,) * prompt + (1,) * resp
        adv = rng.choice((-1.0, 1.0)) * rng.uniform(0.2, 1.5)
        out.append(
            TrainSample(
                prompt_id=f"b{i}",
                sample_idx=0,
                token_ids=ids,
                loss_mask=mask,
                behav_logprobs=tuple(-rng.uniform(0.5, 5.0) if m else 0.0 for m in mask),
                advantages=tuple(adv if m else 0.0 for m in mask),
                versions=tuple(0 if m else -1 for m in mask),
                min_version=0,
                max_version=0,
            )
        )
    return out


def _build_model(name: str, root: Path) -> Path:
    from asyncrl.models import TinyModelSpec, build_tiny_policy

    overrides = MODELS[name]
    spec = TinyModelSpec(**overrides) if overrides else TinyModelSpec()
    return build_tiny_policy(root / name, spec)


def _computed_tokens(trainer: Any, samples: list[Any]) -> tuple[int, int]:
    """(tokens the model runs on per pass, micro-batches) under the trainer's plan."""
    lengths = [len(s.token_ids) for s in samples]
    plan = trainer._plan(lengths)
    if trainer.cfg.micro_batching == "packed":
        return sum(lengths), len(plan)
    # padded and padded_grouped: each micro-batch is as long as its longest sequence
    return sum(len(b) * max(lengths[i] for i in b) for b in plan if b), len(plan)


def _bench_model(
    name: str, model_dir: Path, samples: list[Any], budget: int, padded_sizes: list[int], steps: int
) -> list[dict[str, Any]]:
    from asyncrl.config import AlgoConfig, TrainerConfig
    from asyncrl.models import count_parameters, load_policy
    from asyncrl.trainer.trainer import Trainer
    from asyncrl.types import TrainBatch

    longest = max(len(s.token_ids) for s in samples)
    same_budget = max(1, budget // longest)
    sizes = sorted(set(padded_sizes) | {same_budget})
    configs: list[tuple[str, dict[str, Any]]] = [("packed", {"max_tokens_per_micro_batch": budget})]
    configs += [
        (mode, {"micro_batching": mode, "padded_micro_batch_size": s})
        for mode in ("padded", "padded_grouped")
        for s in sizes
    ]
    trainers = []
    n_params = 0
    for _, overrides in configs:
        model, _ = load_policy(model_dir)
        n_params = count_parameters(model)
        # lr 0: identical weights on every side and step (the work does not depend on the values)
        trainers.append(Trainer(model, TrainerConfig(lr=0.0, warmup_steps=0, **overrides), AlgoConfig()))
    real = sum(len(s.token_ids) for s in samples)
    times: list[list[float]] = [[] for _ in configs]
    for step in range(steps + 1):  # step 0 warms up (allocations, first-call overheads)
        for k, trainer in enumerate(trainers):
            batch = TrainBatch(tuple(samples), trainer.version)
            t0 = time.perf_counter()
            trainer.train_step(batch)
            if step > 0:
                times[k].append(time.perf_counter() - t0)
    rows = []
    for (mode, overrides), trainer, ts in zip(configs, trainers, times, strict=True):
        computed, n_micro = _computed_tokens(trainer, samples)
        step_s = statistics.median(ts)
        rows.append(
            {
                "model": name,
                "parameters": n_params,
                "micro_batching": mode,
                "max_tokens_per_micro_batch": budget if mode == "packed" else None,
                "padded_micro_batch_size": overrides.get("padded_micro_batch_size"),
                "same_budget": mode != "padded_grouped"
                and (mode == "packed" or overrides.get("padded_micro_batch_size") == same_budget),
                "samples": len(samples),
                "trained_tokens": real,
                "computed_tokens": computed,
                "padding_frac": 1.0 - real / computed,
                "micro_batches": n_micro,
                "step_time_s": step_s,
                "step_times_s": ts,
                "trained_tokens_per_s": real / step_s,
            }
        )
    return rows


def run_train_bench(
    json_path: str | Path | None = None,
    *,
    models: tuple[str, ...] = ("tiny", "20m"),
    samples: int = 128,
    samples_20m: int = 64,
    budget: int = 2048,
    padded_sizes: tuple[int, ...] = (1, 2, 4, 8, 16),
    steps: int = 3,
    steps_20m: int = 1,
    seed: int = 0,
    threads: int = 1,
) -> dict[str, Any]:
    """Run the benchmark, print a table, write JSON (``rows`` + ``ratios``) when ``json_path``."""
    import torch

    torch.set_num_threads(threads)
    rows: list[dict[str, Any]] = []
    ratios: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-train-") as tmp:
        for name in models:
            model_dir = _build_model(name, Path(tmp))
            n, k = (samples, steps) if name == "tiny" else (samples_20m, steps_20m)
            got = _bench_model(name, model_dir, bench_samples(n, seed), budget, list(padded_sizes), k)
            rows.extend(got)
            packed = next(r for r in got if r["micro_batching"] == "packed")
            padded = [r for r in got if r["micro_batching"] == "padded"]
            grouped = [r for r in got if r["micro_batching"] == "padded_grouped"]
            same = next(r for r in padded if r["same_budget"])
            best = max(padded, key=lambda r: r["trained_tokens_per_s"])
            best_grouped = max(grouped, key=lambda r: r["trained_tokens_per_s"])
            rate = packed["trained_tokens_per_s"]
            ratios[f"{name}_packed_vs_padded_same_budget"] = rate / same["trained_tokens_per_s"]
            ratios[f"{name}_packed_vs_best_padded"] = rate / best["trained_tokens_per_s"]
            ratios[f"{name}_packed_vs_best_padded_grouped"] = rate / best_grouped["trained_tokens_per_s"]
            ratios[f"{name}_best_padded_grouped_size"] = best_grouped["padded_micro_batch_size"]
    result = {
        "benchmark": "train",
        "config": {
            "samples": samples,
            "samples_20m": samples_20m,
            "budget": budget,
            "steps": steps,
            "steps_20m": steps_20m,
            "threads": threads,
            "seed": seed,
        },
        "rows": rows,
        "ratios": ratios,
    }
    _print_table(rows, ratios)
    if json_path is not None:
        write_text_result(json_path, json.dumps(result, indent=2))  # never over a file (asyncrl.results)
    return result


def _print_table(rows: list[dict[str, Any]], ratios: dict[str, float]) -> None:
    header = f"{'model':6} {'mode':14} {'budget/size':>11} {'micro':>5} {'pad%':>5} {'step s':>7} {'tok/s':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        size = r["max_tokens_per_micro_batch"] if r["micro_batching"] == "packed" else r["padded_micro_batch_size"]
        mark = "*" if r["same_budget"] and r["micro_batching"] == "padded" else " "
        print(
            f"{r['model']:6} {r['micro_batching']:14} {size!s:>10}{mark} {r['micro_batches']:>5} "
            f"{100 * r['padding_frac']:>5.1f} {r['step_time_s']:>7.2f} {r['trained_tokens_per_s']:>8.0f}"
        )
    print("(* padded size that fits the packed token budget)")
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}x" if isinstance(v, float) else f"{k}: {v}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json``, ``--models``, ``--samples``, ``--budget``, ``--steps``, ``--steps-20m``."""
    add_json(parser, "write the results here")
    parser.add_argument("--models", default="tiny,20m", help="comma-separated: " + ",".join(MODELS))
    parser.add_argument("--samples", type=int, default=128, help="samples per batch (default 128)")
    parser.add_argument("--budget", type=int, default=2048, help="packed max_tokens_per_micro_batch (default 2048)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per configuration, after one warm-up")
    parser.add_argument("--steps-20m", type=int, default=1, help="timed steps for the 20M model (default 1)")


def run(args: argparse.Namespace) -> None:
    """The benchmark at the sizes given."""
    models = tuple(args.models.split(","))
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        raise ConfigError(f"--models: unknown {unknown} (available: {', '.join(MODELS)})")
    run_train_bench(
        args.json, models=models, samples=args.samples, budget=args.budget, steps=args.steps, steps_20m=args.steps_20m
    )
