"""The local launcher: one machine, asyncio; LocalEngine in a thread, the trainer in its own process.

``train(cfg)`` is what ``asyncrl train`` runs by default (``launch.kind=local``): warm start
(cached), then ``launch.runner.run_stages`` over a ``LocalEngine`` (or, with ``launch.engine_urls``,
an ``EnginePool`` of ``RemoteEngine`` clients of running servers), the trainer in a child process
(``controller.trainer_process``; in this process under ``torchrun`` or when turned off) and the
arithmetic verifier inline or a ``RewardService`` for the others. ``train(cfg, resume=True)``
(``asyncrl train --resume RUN_DIR``) continues a run from its newest checkpoint in
``RUN_DIR/checkpoints/``; with no checkpoint yet it starts over. ``launch.kind=ray`` hands over to
``launch.ray.train_ray``.
"""

from __future__ import annotations

import asyncio
import copy
import time
from pathlib import Path
from typing import Any

from asyncrl.config import Config, with_values
from asyncrl.launch.runner import ClaimedRunDir, Stages, prepare_run_dir, run_stages
from asyncrl.launch.stages import (
    build_engine,
    build_remote_pool,
    build_scoring,
    build_trainer,
    configure_threads,
    load_model,
    seed_everything,
)
from asyncrl.launch.trainer_process import TrainerProcess
from asyncrl.launch.warm_start import ensure_policy
from asyncrl.models import stop_token_ids
from asyncrl.rollout.api import RolloutEngine
from asyncrl.trainer.api import PolicyTrainer

__all__ = ["train"]


async def _train_async(cfg: Config, claimed: ClaimedRunDir, resume: bool = False) -> dict[str, Any]:
    t_start = time.perf_counter()
    model_dir = ensure_policy(cfg)
    t_warm = time.perf_counter() - t_start
    seed_everything(cfg.run.seed)
    model, tokenizer = load_model(cfg, model_dir)
    stops = stop_token_ids(tokenizer, model)
    if cfg.launch.engine_urls:  # servers that load weights from a path
        cfg = with_values(cfg, {"trainer.weight_transport": "safetensors"})
        engine: RolloutEngine = build_remote_pool(cfg.launch.engine_urls)
    else:
        # the trainer process builds its own copy; a trainer thread needs the engine's to be separate
        engine = build_engine(cfg, model if cfg.controller.trainer_process else copy.deepcopy(model), tokenizer)
    if cfg.controller.trainer_process:  # its own process: no GIL shared with the engine's decode loop
        trainer: PolicyTrainer = TrainerProcess(str(model_dir), cfg)
    else:
        trainer = build_trainer(cfg, model, tokenizer)
    score, service = build_scoring(cfg, tokenizer)

    async def close() -> None:
        engine.close()
        if isinstance(trainer, TrainerProcess):
            trainer.close()
        if service is not None:
            await service.close()

    stages = Stages(
        engine=engine,
        trainer=trainer,
        score=score,
        tokenizer=tokenizer,
        stop_token_ids=stops,
        model_dir=Path(model_dir),
        close=close,
    )
    return await run_stages(cfg, claimed, stages, resume=resume, t_start=t_start, t_warm=t_warm)


def train(
    cfg: Config, resume: bool = False, overwrite: bool = False, allow_change: tuple[str, ...] = ()
) -> tuple[Path, dict[str, Any]]:
    """Run one training job (``resume``: continue ``cfg.run.run_dir`` from its newest
    checkpoint); returns (run directory, summary). The directory is locked for this process for the
    whole run (a second one is refused). A directory that already holds a run is refused before
    anything is written, unless ``resume``, or ``overwrite`` (the old run is moved aside to
    ``<dir>.old-<time>``; see ``controller.run_claim.claim_run_dir``). A resume refuses config changes
    other than ``launch.resume_guard.FREE_KEYS`` and the keys in ``allow_change``.
    ``launch.kind=ray`` runs ``launch.ray.train_ray``."""
    if cfg.launch.kind == "ray":
        from asyncrl.launch.ray import train_ray

        return train_ray(cfg, resume=resume, overwrite=overwrite, allow_change=allow_change)
    claimed = prepare_run_dir(cfg, resume=resume, overwrite=overwrite, allow_change=allow_change)
    try:
        configure_threads(cfg)
        summary = asyncio.run(_train_async(cfg, claimed, resume))
    finally:
        claimed.lock.release()
    return claimed.path, summary
