"""``python -m benchmarks tinker-loop``: a cookbook-style RL loop through the official ``tinker`` client
against ``asyncrl train``, same task, same budget, per seed; and a LoRA weight update against a full one.

Per seed, one after the other, from the same warm-started tiny policy (``launch.warm_start.ensure_policy``:
the cached one of the config):

1. **``asyncrl train``** (``launch.local.train``) with the budget below: held-out accuracy before and
   after (its own evaluator), RL wall time.
2. **The Tinker loop.** ``asyncrl serve training``'s service (in this process, on a free port) driven by
   ``tinker.ServiceClient``, as a tinker-cookbook RL recipe is written: each step samples ``batch_size``
   training prompts x ``group_size`` (``save_weights_and_get_sampling_client``), scores them with the
   task's verifier (``reward.arithmetic``), computes GRPO advantages per group (groups of equal rewards
   dropped, as ``algo.filter_equal_rewards``), scales them by the batch's token count (Tinker's losses
   are sums; the project's ``token_mean``), runs ``forward_backward(..., "ppo")`` and ``optim_step``
   with the run's Adam settings. Synchronous and on-policy (each batch sampled by the weights it trains).
   The final weights are saved as a sampler checkpoint (a Hugging Face directory) and evaluated by the
   project's own evaluator (``launch.stages.evaluate_once``), so both arms are measured alike.
3. **The budget** is the same for both: ``--steps`` optimizer steps of ``--batch-size`` prompts x
   ``--group-size`` samples of at most ``--max-new-tokens``, LoRA of rank ``--lora-rank`` (``trainer.lora_rank``
   for ``asyncrl train``), learning rate ``--lr``, no warm-up, gradient clip 1.0.
4. **Weight updates** (``--update-repeats``): the bytes of a LoRA update (the adapter tensors alone, as
   the service ships them: ``WeightUpdate.adapter``) against a full update's, and the seconds each takes
   to reach an idle engine (export + ``LocalEngine.update_weights``, in process). ``python -m benchmarks
   lora-update`` measures this in more detail (samples in flight, decode cost).

Over seeds: means with 95% t-intervals of accuracy before/after and of each arm's gain.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from asyncrl.results import write_text_result
from benchmarks import options
from benchmarks.options import add_json, add_out, add_overrides, add_seeds, parse_list
from benchmarks.runs import train_or_stop
from benchmarks.stats import mean_ci95

__all__ = ["add_arguments", "measure_updates", "run", "run_tinker_loop_bench"]

API_KEY = "tml-benchmark"


def _budget(args: argparse.Namespace) -> list[str]:
    """The overrides that fix the budget of both arms."""
    return [
        f"controller.total_steps={args.steps}",
        f"controller.batch_size={args.batch_size}",
        f"rollout.group_size={args.group_size}",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        f"eval.max_new_tokens={args.max_new_tokens}",
        f"task.eval_size={args.eval_size}",
        f"trainer.lora_rank={args.lora_rank}",
        f"trainer.lr={args.lr}",
        "trainer.warmup_steps=0",
        "controller.checkpoint_every=0",
    ]


def _train_arm(cfg: Any, out: Path) -> dict[str, Any]:
    from asyncrl.config import with_values

    _, summary = train_or_stop(with_values(cfg, {"run.run_dir": str(out / "train")}))
    before, after = summary.get("eval_before") or {}, summary.get("eval_after") or {}
    return {
        "accuracy_before": before.get("accuracy"),
        "accuracy_after": after.get("accuracy"),
        "steps": summary.get("steps"),
        "wall_s": summary.get("rl_wall_s"),
    }


def _advantages(rewards: list[float]) -> list[float] | None:
    """GRPO's ``(r - mean) / (std + 1e-6)`` of one group; None when all rewards are equal (dropped)."""
    if max(rewards) == min(rewards):
        return None
    mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
    return [(r - mean) / (std + 1e-6) for r in rewards]


def _tinker_step(tc: Any, sampler: Any, prompts: list[Any], cfg: Any, tokenizer: Any) -> dict[str, float]:
    """One cookbook-style step: sample, score, advantages, forward_backward, optim_step."""
    from tinker import types

    from asyncrl.reward.arithmetic import arithmetic_reward

    params = types.SamplingParams(max_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature)
    futures = [
        sampler.sample(types.ModelInput.from_ints(list(p.token_ids)), cfg.rollout.group_size, params) for p in prompts
    ]
    groups, rewards_all = [], []
    for prompt, future in zip(prompts, futures, strict=True):
        seqs = future.result().sequences
        rewards = [arithmetic_reward(tokenizer.decode(s.tokens, skip_special_tokens=True), prompt.answer) for s in seqs]
        rewards_all += rewards
        adv = _advantages(rewards)
        if adv is not None:
            groups.append((list(prompt.token_ids), seqs, adv))
    n_tokens = sum(len(s.tokens) for _, seqs, _ in groups for s in seqs)
    data = []
    for prompt, seqs, adv in groups:
        for seq, a in zip(seqs, adv, strict=True):
            tokens, n = prompt + list(seq.tokens), len(prompt) - 1
            data.append(
                types.Datum(
                    model_input=types.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={
                        "target_tokens": tokens[1:],
                        "logprobs": [0.0] * n + list(seq.logprobs),
                        "advantages": [0.0] * n + [a / n_tokens] * len(seq.tokens),
                    },
                )
            )
    if data:
        clip = cfg.algo.eps_clip
        config = {"clip_low_threshold": 1 - clip, "clip_high_threshold": 1 + (cfg.algo.eps_clip_high or clip)}
        tc.forward_backward(data, "ppo", config).result()
    b1, b2 = cfg.trainer.betas
    tc.optim_step(
        types.AdamParams(
            learning_rate=cfg.trainer.lr, beta1=b1, beta2=b2, eps=1e-8, grad_clip_norm=cfg.trainer.grad_clip
        )
    ).result()
    return {"reward": statistics.fmean(rewards_all), "trained_groups": len(groups)}


def _tinker_arm(cfg: Any, warm: Path, out: Path) -> dict[str, Any]:
    import tinker

    from asyncrl.data.prompts import build_task
    from asyncrl.models import load_tokenizer
    from asyncrl.service import EngineSpec, ServiceThread

    tokenizer = load_tokenizer(warm)
    train_prompts, _, _ = build_task(cfg.task, tokenizer)
    rng = random.Random(cfg.run.seed)
    longest = max(len(p.token_ids) for p in train_prompts)
    slots = cfg.controller.batch_size * cfg.rollout.group_size
    spec = EngineSpec(max_slots=slots, max_seq_len=longest + cfg.rollout.max_new_tokens)
    with ServiceThread({"policy": warm}, out / "tinker", api_key=API_KEY, engine=spec) as srv:
        t0 = time.perf_counter()
        client = tinker.ServiceClient(base_url=srv.url, api_key=API_KEY)
        tc = client.create_lora_training_client(
            base_model="policy", rank=cfg.trainer.lora_rank, seed=cfg.run.seed
        ).result()
        curve = []
        for _ in range(cfg.controller.total_steps):
            sampler = tc.save_weights_and_get_sampling_client().result()
            batch = rng.sample(train_prompts, cfg.controller.batch_size)
            curve.append(_tinker_step(tc, sampler, batch, cfg, tokenizer))
        final = tc.save_weights_for_sampler("final").result().path
        wall_s = time.perf_counter() - t0
        client.close("success").result()
    final_dir = out / "tinker" / "runs" / tc.model_id / "sampler_weights" / "final"
    assert final.endswith("/final") and final_dir.is_dir()
    after = _evaluate(cfg, final_dir)
    return {"accuracy_after": after.get("accuracy"), "steps": len(curve), "wall_s": wall_s, "curve": curve}


def _evaluate(cfg: Any, model_dir: Path) -> dict[str, Any]:
    """Held-out accuracy of ``model_dir`` by the project's own evaluator (what ``asyncrl eval`` runs)."""
    from asyncrl.data.prompts import build_task, drop_long_prompts
    from asyncrl.launch.stages import build_engine, evaluate_once, load_model
    from asyncrl.models import stop_token_ids

    model, tokenizer = load_model(cfg, model_dir)
    _, held_out, _ = build_task(cfg.task, tokenizer)
    held_out = drop_long_prompts(held_out, cfg.rollout.max_prompt_len, "held-out prompts")
    engine = build_engine(cfg, model, tokenizer)
    try:
        return asyncio.run(evaluate_once(cfg, engine, held_out, tokenizer, stop_token_ids(tokenizer, model)))
    finally:
        engine.close()


def measure_updates(model_dir: Path, rank: int, repeats: int) -> dict[str, Any]:
    """Bytes of a LoRA update's adapter against a full update's, and the seconds each takes to reach an
    idle ``LocalEngine`` (export + apply between decode steps; median of ``repeats``)."""
    from asyncrl.models import load_policy
    from asyncrl.rollout.engine import LocalEngine
    from asyncrl.service.model import LoraSpec, TrainedModel
    from asyncrl.types import WeightUpdate

    def nbytes(tensors: list[Any]) -> int:
        return sum(t.numel() * t.element_size() for t in {t.data_ptr(): t for t in tensors}.values())

    model, tokenizer = load_policy(model_dir)
    engine = LocalEngine(model, tokenizer, max_slots=1, max_seq_len=64)
    engine.start()
    out: dict[str, Any] = {"lora_rank": rank}
    try:
        for name, lora in (("lora", LoraSpec(rank)), ("full", None)):
            trained, times = TrainedModel(model_dir, lora), []
            for version in range(1, repeats + 1):
                t0 = time.perf_counter()
                if lora is not None:  # the adapters alone
                    layers = trained.adapter_layers()
                    update, shipped = WeightUpdate(version, adapter=layers), [t for f in layers.values() for t in f[:2]]
                else:
                    state = trained.merged_state()
                    update, shipped = WeightUpdate(version, tensors=state), list(state.values())
                asyncio.run(engine.update_weights(update))
                times.append(time.perf_counter() - t0)
            out[f"{name}_trained_bytes"] = nbytes(list(trained.trainable_state().values()))
            out[f"{name}_update_bytes"] = nbytes(shipped)
            out[f"{name}_update_s"] = statistics.median(times)
    finally:
        engine.close()
    out["adapter_over_full_bytes"] = out["lora_update_bytes"] / out["full_update_bytes"]
    return out


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"accuracy_before": mean_ci95([r["accuracy_before"] for r in rows])}
    for arm in ("train", "tinker"):
        after = [r[arm]["accuracy_after"] for r in rows]
        gains = [100 * (a - r["accuracy_before"]) for a, r in zip(after, rows, strict=True)]
        out[arm] = {
            "accuracy_after": mean_ci95(after),
            "wall_s": mean_ci95([r[arm]["wall_s"] for r in rows]),
            "gain_points": mean_ci95(gains),
        }
    return out


def run_tinker_loop_bench(args: argparse.Namespace, seeds: list[int]) -> dict[str, Any]:
    """Both arms per seed and the weight-update measure (module docstring); writes ``args.json``."""
    from asyncrl.config import load_config, with_values
    from asyncrl.launch.warm_start import ensure_policy
    from benchmarks.runs import fresh_out

    out, rows = fresh_out(args.out), []
    base = [*options.overrides(args), *_budget(args)]
    warm = ensure_policy(load_config(args.config, base))
    for seed in seeds:
        cfg = with_values(load_config(args.config, [*base, f"run.seed={seed}"]), {"model.path": str(warm)})
        train_row = _train_arm(cfg, out / f"seed{seed}")
        tinker_row = _tinker_arm(cfg, warm, out / f"seed{seed}")
        rows.append(
            {"seed": seed, "accuracy_before": train_row["accuracy_before"], "train": train_row, "tinker": tinker_row}
        )
        print(
            f"seed {seed}: before {train_row['accuracy_before']:.3f}; asyncrl train -> "
            f"{train_row['accuracy_after']:.3f} in {train_row['wall_s']:.0f} s; tinker loop -> "
            f"{tinker_row['accuracy_after']:.3f} in {tinker_row['wall_s']:.0f} s",
            flush=True,
        )
    updates = measure_updates(warm, args.lora_rank, args.update_repeats)
    payload = {
        "bench": "tinker-loop",
        "config": args.config,
        "overrides": base,
        "model": str(warm),
        "rows": rows,
        "summary": _summary(rows),
        "weight_updates": updates,
    }
    print(json.dumps({"summary": payload["summary"], "weight_updates": updates}, indent=2))
    if args.json:
        write_text_result(args.json, json.dumps(payload, indent=2) + "\n")
    return payload


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json``, ``--config``, ``--set``, ``--model``, ``--seeds`` and the budget."""
    add_json(parser)
    parser.add_argument("--config", help="YAML config of both arms (default: the embedded task)")
    add_overrides(parser, model_help="start both arms from this model directory (default: the cached warm start)")
    add_seeds(parser, "0,1,2")
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps of each arm (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=4, help="prompts per step (default %(default)s)")
    parser.add_argument("--group-size", type=int, default=4, help="samples per prompt (default %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="per sample (default %(default)s)")
    parser.add_argument("--eval-size", type=int, default=32, help="held-out prompts (default %(default)s)")
    parser.add_argument("--lora-rank", type=int, default=8, help="both arms (default %(default)s)")
    parser.add_argument("--lr", type=float, default=1e-3, help="both arms (default %(default)s)")
    parser.add_argument("--update-repeats", type=int, default=5, help="weight updates timed (default %(default)s)")
    add_out(parser, "runs/bench-tinker-loop")


def run(args: argparse.Namespace) -> None:
    """Both arms per seed, then the weight-update measure."""
    run_tinker_loop_bench(args, list(parse_list(args.seeds, int, (0, 1, 2), "--seeds")))
