"""The local launcher: one process, asyncio, LocalEngine in a thread, the trainer in another.

``train(cfg)`` is what ``asyncrl train`` runs: warm start (cached), held-out accuracy before,
the asynchronous RL loop, held-out accuracy after, a final checkpoint, ``summary.json``.
"""

from __future__ import annotations

import asyncio
import copy
import random
import time
from pathlib import Path
from typing import Any

from asyncrl.config import Config
from asyncrl.controller.evaluate import evaluate
from asyncrl.controller.loop import Controller
from asyncrl.controller.rundir import RunDir, default_run_dir
from asyncrl.controller.scoring import make_score_fn
from asyncrl.controller.warm_start import ensure_policy
from asyncrl.data.prompts import PromptSource, build_task
from asyncrl.models import load_policy, stop_token_ids


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def configure_torch(cfg: Config) -> None:
    import torch

    if cfg.run.torch_threads > 0:
        torch.set_num_threads(cfg.run.torch_threads)


async def _train_async(cfg: Config, run_dir: Path) -> dict[str, Any]:
    from asyncrl.rollout.engine import LocalEngine
    from asyncrl.trainer.trainer import Trainer

    t_start = time.perf_counter()
    model_dir = ensure_policy(cfg)
    t_warm = time.perf_counter() - t_start
    seed_everything(cfg.run.seed)
    model, tokenizer = load_policy(model_dir, device=cfg.model.device, dtype=cfg.model.dtype)
    engine_model = copy.deepcopy(model)
    stops = stop_token_ids(tokenizer, model)
    max_len = cfg.rollout.max_new_tokens + 512
    engine = LocalEngine(
        engine_model,
        tokenizer,
        max_slots=cfg.rollout.max_slots,
        max_seq_len=max_len,
        interrupt_mode=cfg.rollout.interrupt_mode,
        device=cfg.model.device,
    )
    trainer = Trainer(model, cfg.trainer, cfg.algo, temperature=cfg.rollout.temperature, device=cfg.model.device)
    train_prompts, held_out, _ = build_task(cfg.task, tokenizer)
    service = None
    if cfg.task.verifier != "arithmetic":
        from asyncrl.reward.service import RewardService

        service = RewardService(
            num_workers=cfg.reward.num_workers, timeout_s=cfg.reward.timeout_s, max_retries=cfg.reward.max_retries
        )
    score = make_score_fn(cfg.task.verifier, tokenizer, service)
    rundir = RunDir(run_dir, cfg)
    eval_kw = dict(
        greedy=cfg.eval.greedy,
        temperature=cfg.rollout.temperature,
        max_new_tokens=cfg.eval.max_new_tokens,
        stop_token_ids=stops,
        samples_per_prompt=cfg.eval.samples_per_prompt,
    )
    greedy_kw = {**eval_kw, "greedy": True}
    try:
        before = await evaluate(engine, held_out, score, **eval_kw)
        if cfg.eval.report_greedy:
            before["greedy_accuracy"] = (await evaluate(engine, held_out, score, **greedy_kw))["accuracy"]
        print(f"held-out accuracy before RL: {before['accuracy']:.3f} (greedy {before.get('greedy_accuracy')})")
        controller = Controller(
            cfg, engine, trainer, PromptSource(train_prompts, cfg.run.seed), score, rundir,
            tokenizer=tokenizer, stop_token_ids=stops,
        )  # fmt: skip
        t_rl = time.perf_counter()
        state = await controller.run()
        rl_wall = time.perf_counter() - t_rl
        after = await evaluate(engine, held_out, score, **eval_kw)
        if cfg.eval.report_greedy:
            after["greedy_accuracy"] = (await evaluate(engine, held_out, score, **greedy_kw))["accuracy"]
        print(f"held-out accuracy after RL:  {after['accuracy']:.3f} (greedy {after.get('greedy_accuracy')})")
        ckpt = run_dir / "checkpoint"
        model.save_pretrained(str(ckpt), safe_serialization=True)
        tokenizer.save_pretrained(str(ckpt))
        engine_stats = engine.stats()
    finally:
        engine.close()
        if service is not None:
            await service.close()
    summary = {
        "accuracy_before": before["accuracy"],
        "accuracy_after": after["accuracy"],
        "accuracy_gain": after["accuracy"] - before["accuracy"],
        "accuracy_mode": "greedy" if cfg.eval.greedy else f"sampled (T={cfg.rollout.temperature}, "
        f"{cfg.eval.samples_per_prompt} per prompt)",
        "accuracy_greedy_before": before.get("greedy_accuracy"),
        "accuracy_greedy_after": after.get("greedy_accuracy"),
        "response_len_before": before["response_len"],
        "response_len_after": after["response_len"],
        "steps": state.step,
        "wall_s": time.perf_counter() - t_start,
        "warm_start_s": t_warm,
        "rl_wall_s": rl_wall,
        "trained_tokens": state.trained_tokens,
        "trained_samples": state.trained_samples,
        "trained_tokens_per_s": state.trained_tokens / rl_wall if rl_wall > 0 else 0.0,
        "max_staleness": cfg.controller.max_staleness,
        "max_staleness_seen": state.max_staleness_seen,
        "staleness_hist": {str(k): v for k, v in sorted(state.staleness_hist.items())},
        "filtered_groups": state.filtered_groups,
        "stale_groups": state.stale_groups,
        "reward_failures": state.reward_failures,
        "skipped_steps": state.skipped_steps,
        "engine_generated_tokens": engine_stats.get("generated_tokens", 0.0),
        "engine_slot_utilisation": engine_stats.get("slot_utilisation", 0.0),
        "model_dir": str(model_dir),
        "checkpoint": str(run_dir / "checkpoint"),
    }
    rundir.write_summary(summary)
    rundir.close()
    return summary


def train(cfg: Config) -> tuple[Path, dict[str, Any]]:
    """Run one training job; returns (run directory, summary)."""
    configure_torch(cfg)
    run_dir = Path(cfg.run.run_dir) if cfg.run.run_dir else default_run_dir()
    summary = asyncio.run(_train_async(cfg, run_dir))
    return run_dir, summary
