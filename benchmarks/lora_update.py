"""``python -m benchmarks lora-update``: a LoRA weight update shipped as the adapters alone against the
same update shipped as full (merged) weights: bytes, time to reach an engine, and the decode cost.

Owns the benchmark and its command (``add_arguments``, ``run``). Per model (a tiny random-init decoder
built locally, optionally a larger random-init shape, and any model directory given), with a LoRA of rank
``--rank`` on every linear layer of attention and MLP (the service's ``TrainedModel``, adapters given
random B so that they act):

1. **Bytes**: the adapter tensors of an adapter-only update (``WeightUpdate.adapter``) against the
   tensors of a full update (the merged weights, every parameter).
2. **Idle engine**: seconds from the call until ``LocalEngine`` has applied the update: exporting it from
   the trained model (``adapter_layers`` resp. ``merged_state``, the merge included) plus
   ``update_weights`` (between two decode steps). Median of ``--repeats``.
3. **Samples in flight** (the Tinker service's path, ``service.sampling.EnginePool.publish``): a request
   of ``--slots`` samples x ``--tokens`` tokens decodes on the model's live engine when the update is
   published; the seconds the publish takes. An adapter update goes in at the next step boundary (the
   samples finish on their version); a full update waits until they have finished. Median of
   ``--repeats``; ``in_flight_kept_version`` says every in-flight token kept the version it started with.
4. **Decode cost**: tokens/s of a batch of ``--slots`` samples x ``--tokens`` tokens on the base weights
   (what merged weights cost), on one adapter version, and on two versions mixed in the same batches.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.options import add_json, parse_list
from benchmarks.runs import write_json

__all__ = ["SHAPES", "add_arguments", "measure_model", "run", "run_lora_update_bench"]

SHAPES: dict[str, dict[str, int]] = {
    "tiny": {},
    "d512": {"hidden_size": 512, "intermediate_size": 1408, "num_layers": 8, "num_heads": 8, "num_kv_heads": 4},
    "d1024": {"hidden_size": 1024, "intermediate_size": 2816, "num_layers": 12, "num_heads": 16, "num_kv_heads": 4},
}
"""Random-init decoders built locally (``models.TinyModelSpec`` fields; ``tiny`` is the project's tiny policy)."""


def _nbytes(tensors: list[Any]) -> int:
    unique = {t.data_ptr(): t for t in tensors}
    return sum(t.numel() * t.element_size() for t in unique.values())


def _trained(model_dir: Path, rank: int, seed: int) -> Any:
    """The service's LoRA model of ``model_dir`` with random B factors (so that the adapters act)."""
    import torch

    from asyncrl.service.model import LoraSpec, TrainedModel

    trained = TrainedModel(model_dir, LoraSpec(rank, seed=seed))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in trained.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return trained


def _prompt(tokenizer: Any) -> list[int]:
    return list(tokenizer("Q:12+30=?\nA:")["input_ids"])


def _idle(model_dir: Path, trained: Any, repeats: int) -> dict[str, Any]:
    """Export + ``update_weights`` on an idle engine, each kind ``repeats`` times (medians)."""
    from asyncrl.models import load_policy
    from asyncrl.rollout.engine import LocalEngine
    from asyncrl.types import WeightUpdate

    model, tokenizer = load_policy(model_dir)
    engine = LocalEngine(model, tokenizer, max_slots=1, max_seq_len=64)
    out: dict[str, Any] = {}
    version = 0
    try:
        for kind in ("adapter", "full"):
            total, apply = [], []
            for _ in range(repeats):
                version += 1
                before = engine.stats()["update_s"]
                t0 = time.perf_counter()
                if kind == "adapter":
                    layers = trained.adapter_layers()
                    update = WeightUpdate(version, adapter=layers)
                    nbytes = _nbytes([t for a, b, _ in layers.values() for t in (a, b)])
                else:
                    state = trained.merged_state()
                    update = WeightUpdate(version, tensors=state)
                    nbytes = _nbytes(list(state.values()))
                asyncio.run(engine.update_weights(update))
                total.append(time.perf_counter() - t0)
                apply.append(engine.stats()["update_s"] - before)
            out[f"{kind}_update_bytes"] = nbytes
            out[f"{kind}_call_to_applied_s"] = statistics.median(total)
            out[f"{kind}_engine_apply_s"] = statistics.median(apply)
    finally:
        engine.close()
    out["adapter_over_full_bytes"] = out["adapter_update_bytes"] / out["full_update_bytes"]
    return out


def _in_flight(model_dir: Path, trained: Any, repeats: int, slots: int, tokens: int) -> dict[str, Any]:
    """``EnginePool.publish`` while a batch decodes on the live engine (medians over ``repeats``)."""
    from asyncrl.service.sampling import EnginePool, EngineSpec, SamplerTarget
    from asyncrl.types import WeightUpdate

    prompt = _prompt(trained.tokenizer)
    run_id = "bench"

    async def one_kind(kind: str) -> tuple[list[float], bool]:
        pool = EnginePool(EngineSpec(max_slots=slots, max_seq_len=len(prompt) + tokens + 1, keep_versions=1))
        times, kept = [], True

        def update(version: int) -> WeightUpdate:
            if kind == "adapter":
                return WeightUpdate(version, adapter=trained.adapter_layers())
            return WeightUpdate(version, tensors=trained.merged_state())

        try:
            await pool.publish(run_id, model_dir, update(1))
            for rep in range(repeats):
                old = rep + 1
                target = SamplerTarget(str(model_dir), old, run_id)
                params = {"max_tokens": tokens, "temperature": 1.0, "seed": rep}
                batch = asyncio.ensure_future(pool.sample(target, prompt, params, slots, []))
                while pool.live_stats(run_id).get("running_samples", 0) < slots and not batch.done():  # decoding
                    await asyncio.sleep(0.0005)
                t0 = time.perf_counter()
                await pool.publish(run_id, model_dir, update(old + 1))
                times.append(time.perf_counter() - t0)
                kept &= all(c.versions == (old,) * tokens for c in await batch)
        finally:
            await pool.close()
        return times, kept

    out: dict[str, Any] = {"slots": slots, "tokens": tokens}
    for kind in ("adapter", "full"):
        times, kept = asyncio.run(one_kind(kind))
        out[f"{kind}_publish_s"] = statistics.median(times)
        out[f"{kind}_in_flight_kept_version"] = kept
    return out


def _decode(model_dir: Path, trained: Any, repeats: int, slots: int, tokens: int) -> dict[str, Any]:
    """Tokens/s of one batch on the base weights, on one adapter version, on two versions mixed."""
    import torch

    from asyncrl.models import load_policy
    from asyncrl.rollout.engine import LocalEngine, SamplingParams
    from asyncrl.types import WeightUpdate

    model, tokenizer = load_policy(model_dir)
    prompt = _prompt(tokenizer)
    engine = LocalEngine(model, tokenizer, max_slots=slots, max_seq_len=len(prompt) + tokens + 1, keep_versions=3)
    first = trained.adapter_layers()
    second = {k: (a, b * 0.5 + torch.full_like(b, 1e-3), s) for k, (a, b, s) in first.items()}

    async def batch(versions: list[int]) -> float:
        await engine.pause()  # every request arrives together: one batch from the first step
        calls = [
            asyncio.ensure_future(engine.generate(prompt, SamplingParams(max_new_tokens=tokens, seed=i), version=v))
            for i, v in enumerate(versions)
        ]
        for _ in range(2):
            await asyncio.sleep(0)
        t0 = time.perf_counter()
        await engine.resume()
        await asyncio.gather(*calls)
        return time.perf_counter() - t0

    out: dict[str, Any] = {}
    try:
        asyncio.run(batch([0]))  # warm-up
        asyncio.run(engine.update_weights(WeightUpdate(1, adapter=first)))
        asyncio.run(engine.update_weights(WeightUpdate(2, adapter=second)))
        mixed = [1 + i % 2 for i in range(slots)]
        arms = {"base": [0] * slots, "one_adapter": [1] * slots, "two_adapters": mixed}
        for arm, versions in arms.items():
            walls = [asyncio.run(batch(versions)) for _ in range(repeats)]
            out[f"{arm}_tokens_per_s"] = slots * tokens / statistics.median(walls)
    finally:
        engine.close()
    for arm in ("one_adapter", "two_adapters"):
        out[f"{arm}_over_base"] = out[f"{arm}_tokens_per_s"] / out["base_tokens_per_s"]
    return out


def measure_model(model_dir: Path, *, rank: int, repeats: int, slots: int, tokens: int) -> dict[str, Any]:
    """Every measure of one model (module docstring)."""
    trained = _trained(model_dir, rank, seed=0)
    params = sum(p.numel() for name, p in trained.hf.named_parameters() if "lora_" not in name)
    row: dict[str, Any] = {"model": str(model_dir), "parameters": params, "lora_rank": rank}
    row["idle"] = _idle(model_dir, trained, repeats)
    row["in_flight"] = _in_flight(model_dir, trained, repeats, slots, tokens)
    row["decode"] = _decode(model_dir, trained, repeats, slots, tokens)
    return row


def run_lora_update_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Every model's row; writes ``args.json``."""
    import torch

    from asyncrl.models import TinyModelSpec, build_tiny_policy

    shapes = parse_list(args.shapes, str, ("tiny",), "--shapes")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        from asyncrl.config import ConfigError

        raise ConfigError(f"--shapes: unknown {unknown} (known: {', '.join(SHAPES)})")
    extra = [Path(p) for p in parse_list(args.models, str, (), "--models")]
    for path in extra:
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"--models: {path} holds no config.json")
    rows = []
    with tempfile.TemporaryDirectory(prefix="asyncrl-lora-bench-") as tmp:
        dirs = [(f"random-init {s}", build_tiny_policy(Path(tmp) / s, TinyModelSpec(**SHAPES[s]))) for s in shapes]
        dirs += [(str(p), p) for p in extra]
        for label, directory in dirs:
            row = {
                "label": label,
                **measure_model(directory, rank=args.rank, repeats=args.repeats, slots=args.slots, tokens=args.tokens),
            }
            row["model"] = label
            idle, flight = row["idle"], row["in_flight"]
            print(
                f"{label}: {row['parameters']:,} parameters; adapter {idle['adapter_update_bytes']:,} B vs full "
                f"{idle['full_update_bytes']:,} B; idle {idle['adapter_call_to_applied_s'] * 1e3:.1f} ms vs "
                f"{idle['full_call_to_applied_s'] * 1e3:.1f} ms; with samples in flight "
                f"{flight['adapter_publish_s'] * 1e3:.1f} ms vs {flight['full_publish_s'] * 1e3:.1f} ms",
                flush=True,
            )
            rows.append(row)
    payload = {
        "bench": "lora-update",
        "rank": args.rank,
        "repeats": args.repeats,
        "slots": args.slots,
        "tokens": args.tokens,
        "torch_threads": torch.get_num_threads(),
        "rows": rows,
    }
    write_json(args.json, payload)
    return payload


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json``, the models (``--shapes``, ``--models``) and the sizes of the measure."""
    add_json(parser)
    parser.add_argument(
        "--shapes", help=f"random-init shapes to build, comma-separated (default tiny; {', '.join(SHAPES)})"
    )
    parser.add_argument("--models", help="model directories to measure too, comma-separated (e.g. a warm start)")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="updates timed per kind (default %(default)s)")
    parser.add_argument("--slots", type=int, default=8, help="samples decoding at once (default %(default)s)")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per sample (default %(default)s)")


def run(args: argparse.Namespace) -> None:
    """Every model's row."""
    run_lora_update_bench(args)
