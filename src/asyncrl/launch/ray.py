"""The Ray launcher (``launch.kind=ray``, ``asyncrl train --launcher ray``): the same run, on actors.

::

    driver (this process): warm start, Controller (asyncio), evaluation, run directory
       │ EnginePool (fewest in-flight tokens) ── RayEngineClient ──► EngineWorker × N  (LocalEngine
       │                                                              or VLLMEngine)
       │                                     └─ ServedEngineClient ─► (engine_mode=server: HTTP)
       │ RayTrainerGroup (SPMD calls) ─────────────────────────────► TrainerRank × M  (FSDP2 group,
       │                                                              gloo on CPU, NCCL on GPU)
       │ RayRewardPool (least busy) ───────────────────────────────► RewardWorker × K
       └ weights: TrainerRank 0 ─ object-store buckets | safetensors dir ─► every engine

All actors share one placement group (bundles: N engines, M trainer ranks, K reward workers, with
the CPU/GPU requests of ``launch``; strategy ``launch.placement_strategy``). The controller gets
the pool, the trainer group and a ``score`` callable and does not know it runs on Ray
(``launch.runner.run_stages`` is the local launcher's flow). Failures: an engine that dies is
restarted in its bundle with the newest weights and its requests are re-run (``EnginePool``); a
reward worker that dies is replaced; a trainer rank that dies stops the run (every rank is
killed), and the error names the newest checkpoint and the command that resumes from it.

Security (docs/security.md): with ``launch.engine_mode=server`` the engines listen on their node's
address, so the launcher makes a fresh API key for the run (``secrets.token_urlsafe``), hands it to
its engine actors (as a call argument: not in the config, the environment or a command line) and
to their clients only, and confines their weight updates to the run's export directory
(``trainer.weight_export_dir``, or a temporary directory removed at the end).

Ray is started here when ``launch.ray_address`` is None (and shut down at the end; its logical CPUs
are ``launch.ray_num_cpus``, or the machine's cores or the run's requests, whichever is more), else joined
(``"auto"``: the cluster of ``ray start --head``); an instance already initialised in this
process is reused and left running.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.auth import new_api_key
from asyncrl.config import Config, with_values
from asyncrl.controller.resume import latest_checkpoint
from asyncrl.launch import RunStopped
from asyncrl.launch.runner import ClaimedRunDir, Stages, prepare_run_dir, run_stages
from asyncrl.launch.stages import build_remote_pool, build_score, configure_threads, load_model, seed_everything
from asyncrl.launch.warm_start import ensure_policy
from asyncrl.models import stop_token_ids
from asyncrl.rollout.api import RolloutEngine

if TYPE_CHECKING:
    from asyncrl.launch.ray_clients import RayRewardPool, RayTrainerGroup
    from asyncrl.rollout.pool import EnginePool

__all__ = ["RayPlacement", "train_ray"]


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:  # the optional extra
        raise RuntimeError("launch.kind=ray needs Ray: pip install 'asyncrl[ray]'") from exc
    return ray


class RayPlacement:
    """The placement group of a run and the actor options of each bundle."""

    def __init__(self, cfg: Config) -> None:
        ray = _ray()
        from ray.util.placement_group import placement_group

        launch = cfg.launch
        self.n_engines = 0 if launch.engine_urls else cfg.rollout.num_engines
        self.n_ranks = launch.trainer_ranks
        self.n_reward = cfg.reward.num_workers

        def bundle(cpus: float, gpus: float) -> dict[str, float]:
            return {k: v for k, v in (("CPU", cpus), ("GPU", gpus)) if v > 0}

        self.bundles = (
            [bundle(launch.cpus_per_engine, launch.gpus_per_engine)] * self.n_engines
            + [bundle(launch.cpus_per_trainer, launch.gpus_per_trainer)] * self.n_ranks
            + [bundle(launch.cpus_per_reward_worker, 0.0)] * self.n_reward
        )
        self.group = placement_group(self.bundles, strategy=launch.placement_strategy)
        ready, _ = ray.wait([self.group.ready()], timeout=launch.startup_timeout_s)
        if not ready:
            need: dict[str, float] = {}
            for b in self.bundles:
                for k, v in b.items():
                    need[k] = need.get(k, 0.0) + v
            ray.util.remove_placement_group(self.group)
            raise RuntimeError(
                f"Ray could not place the run within {launch.startup_timeout_s:.0f} s: it needs {need} "
                f"({self.n_engines} engines, {self.n_ranks} trainer ranks, {self.n_reward} reward workers, "
                f"strategy {launch.placement_strategy}); the cluster has {ray.cluster_resources()}. "
                "Lower launch.cpus_per_* / gpus_per_*, or add nodes (launch.ray_num_cpus for a local instance)."
            )

    def options(self, index: int, cpus: float, gpus: float) -> dict[str, Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(placement_group=self.group, placement_group_bundle_index=index)
        return {"num_cpus": cpus, "num_gpus": gpus, "scheduling_strategy": strategy}

    def remove(self) -> None:
        _ray().util.remove_placement_group(self.group)


@dataclass(frozen=True)
class ServeAuth:
    """What the engine servers of one run (``launch.engine_mode=server``) are started with: a key
    made for this run alone, handed only to its actors and their clients, and the run's weight
    export directory, the only one their ``/update_weights_from_disk`` loads from."""

    api_key: str = field(repr=False)  # never printed
    weights_root: str
    temporary: bool  # made by the launcher (removed at the end of the run)

    @classmethod
    def for_run(cls, cfg: Config) -> ServeAuth:
        root = cfg.trainer.weight_export_dir
        if root:
            Path(root).mkdir(parents=True, exist_ok=True)
            return cls(new_api_key(), str(Path(root).resolve()), False)
        return cls(new_api_key(), tempfile.mkdtemp(prefix="asyncrl-weights-"), True)


async def _build_engines(cfg: Config, model_dir: str, placement: RayPlacement, auth: ServeAuth | None) -> EnginePool:
    """The engine pool: actors (direct or as servers behind ``auth``) or, with
    ``launch.engine_urls``, servers that already run."""
    ray = _ray()
    from asyncrl.launch.ray_actors import EngineWorker
    from asyncrl.launch.ray_clients import RayEngineClient, ServedEngineClient
    from asyncrl.rollout.pool import EnginePool

    if cfg.launch.engine_urls:
        return build_remote_pool(cfg.launch.engine_urls)
    launch = cfg.launch
    remote_cls = ray.remote(EngineWorker)

    async def start(index: int) -> RolloutEngine:
        opts = placement.options(index, launch.cpus_per_engine, launch.gpus_per_engine)
        actor = remote_cls.options(**opts, max_concurrency=10_000).remote(model_dir, cfg)
        if auth is not None:
            url = await actor.serve.remote(auth.api_key, auth.weights_root)
            return ServedEngineClient(url, actor, index, auth.api_key)
        client = RayEngineClient(actor, index)
        await client.fetch_stats()  # constructed (raises here if the engine cannot start)
        return client

    engines = await asyncio.gather(*(start(i) for i in range(placement.n_engines)))
    return EnginePool(engines, restart=start, max_restarts=launch.max_engine_restarts)


def _build_trainer(cfg: Config, model_dir: str, placement: RayPlacement) -> RayTrainerGroup:
    ray = _ray()
    from asyncrl.launch.ray_actors import TrainerRank
    from asyncrl.launch.ray_clients import RayTrainerGroup

    launch = cfg.launch
    remote_cls = ray.remote(TrainerRank)
    ranks = [
        remote_cls.options(
            **placement.options(placement.n_engines + r, launch.cpus_per_trainer, launch.gpus_per_trainer)
        ).remote(r, launch.trainer_ranks, model_dir, cfg)
        for r in range(launch.trainer_ranks)
    ]
    init_method = ray.get(ranks[0].rendezvous.remote(), timeout=launch.startup_timeout_s)
    versions = ray.get([rank.setup.remote(init_method) for rank in ranks], timeout=launch.startup_timeout_s)
    transport = "disk" if (launch.engine_mode == "server" or launch.engine_urls) else launch.weight_sync
    return RayTrainerGroup(ranks, transport, int(versions[0]))


def _build_rewards(cfg: Config, placement: RayPlacement) -> RayRewardPool:
    ray = _ray()
    from asyncrl.launch.ray_actors import RewardWorker
    from asyncrl.launch.ray_clients import RayRewardPool

    remote_cls = ray.remote(RewardWorker)
    first = placement.n_engines + placement.n_ranks

    def make(index: int) -> Any:
        opts = placement.options(first + index, cfg.launch.cpus_per_reward_worker, 0.0)
        return remote_cls.options(**opts, max_concurrency=1_000).remote(cfg)

    return RayRewardPool(make, placement.n_reward)


async def _train_async(cfg: Config, claimed: ClaimedRunDir, resume: bool) -> dict[str, Any]:
    t_start = time.perf_counter()
    model_dir = ensure_policy(cfg)
    t_warm = time.perf_counter() - t_start
    seed_everything(cfg.run.seed)
    model, tokenizer = load_model(cfg, model_dir, device="cpu")  # the tokenizer and stop ids only
    stops = stop_token_ids(tokenizer, model)
    del model
    auth = trainer_cfg = None
    if cfg.launch.engine_mode == "server" and not cfg.launch.engine_urls:
        auth = ServeAuth.for_run(cfg)
        # the run's config (as saved) keeps the user's value
        trainer_cfg = with_values(cfg, {"trainer.weight_export_dir": auth.weights_root})
    placement = RayPlacement(cfg)
    engines = trainer = rewards = None
    loop = asyncio.get_running_loop()
    try:
        engines = await _build_engines(cfg, str(model_dir), placement, auth)
        trainer = await loop.run_in_executor(None, _build_trainer, trainer_cfg or cfg, str(model_dir), placement)
        rewards = _build_rewards(cfg, placement)
    except BaseException:
        for part in (engines, trainer):
            if part is not None:
                part.close()
        placement.remove()
        _remove_temporary(auth)
        raise

    async def close() -> None:
        engines.close()
        trainer.close()
        await rewards.close()
        placement.remove()
        _remove_temporary(auth)

    async def summary_extra() -> dict[str, Any]:
        from asyncrl.launch.ray_clients import RayEngineClient

        await engines.wait_restarts(cfg.launch.startup_timeout_s)  # a restart in progress: counted once back
        # an actor's client caches its counters (refreshed in the background): fetch them now
        per_engine = [e.refresh_stats() if isinstance(e, RayEngineClient) else e.stats() for e in engines.engines]
        classes = [
            await e.fetch_engine_class() if isinstance(e, RayEngineClient) else type(e).__name__
            for e in engines.engines
        ]
        stats = engines.stats()
        return {
            "ray": {
                "engines": placement.n_engines or len(per_engine),
                "trainer_ranks": placement.n_ranks,
                "reward_workers": placement.n_reward,
                "weight_sync": trainer.transport,
                "engine_mode": cfg.launch.engine_mode,
                "engine_classes": classes,
                "engine_versions": [
                    int(s.get("version", e.version)) for s, e in zip(per_engine, engines.engines, strict=True)
                ],
                "engine_weight_updates": [int(s.get("weight_updates", 0)) for s in per_engine],
                "engine_generated_tokens": [float(s.get("generated_tokens", 0.0)) for s in per_engine],
                "engine_deaths": int(stats.get("engine_deaths", 0)),
                "engine_restarts": int(stats.get("engine_restarts", 0)),
                "engine_restart_errors": list(engines.restart_errors),
                "redispatched_requests": int(stats.get("redispatched_requests", 0)),
                "reward_workers_replaced": rewards.replaced,
            }
        }

    stages = Stages(
        engine=engines,
        trainer=trainer,
        score=build_score(cfg, tokenizer, rewards),
        tokenizer=tokenizer,
        stop_token_ids=stops,
        model_dir=Path(model_dir),
        close=close,
        summary_extra=summary_extra,
    )
    return await run_stages(cfg, claimed, stages, resume=resume, t_start=t_start, t_warm=t_warm)


def _remove_temporary(auth: ServeAuth | None) -> None:
    if auth is not None and auth.temporary:
        shutil.rmtree(auth.weights_root, ignore_errors=True)


def local_cpus(cfg: Config) -> int:
    """Logical CPUs of a Ray instance started on this machine: its cores, or what the run asks for
    when that is more (one machine shares its cores anyway, as the local launcher does)."""
    launch = cfg.launch
    need = (
        (0 if launch.engine_urls else cfg.rollout.num_engines) * launch.cpus_per_engine
        + launch.trainer_ranks * launch.cpus_per_trainer
        + cfg.reward.num_workers * launch.cpus_per_reward_worker
    )
    return max(os.cpu_count() or 1, math.ceil(need))


def train_ray(
    cfg: Config, resume: bool = False, overwrite: bool = False, allow_change: tuple[str, ...] = ()
) -> tuple[Path, dict[str, Any]]:
    """``launch.local.train`` on Ray actors (see the module docstring)."""
    from asyncrl.launch.ray_clients import TrainerRankDied

    ray = _ray()
    claimed = prepare_run_dir(cfg, resume=resume, overwrite=overwrite, allow_change=allow_change)
    run_dir = claimed.path
    started = False
    try:
        configure_threads(cfg)
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
            if cfg.launch.ray_address is None:
                kwargs["num_cpus"] = cfg.launch.ray_num_cpus or local_cpus(cfg)
                # Ray starts its workers at nice 15; here the workers (engines, trainer ranks, reward
                # workers) are the run itself, so on a shared machine they must not yield to every
                # other process (beside two busy processes on 2 cores they got ~2% of a core each).
                kwargs["_system_config"] = {"worker_niceness": 0}
            ray.init(address=cfg.launch.ray_address, **kwargs)
            started = True
        summary = asyncio.run(_train_async(cfg, claimed, resume))
    except TrainerRankDied as exc:
        ckpt = latest_checkpoint(run_dir)
        where = f"its newest checkpoint is {ckpt}" if ckpt is not None else "it has no checkpoint yet (starts over)"
        raise RunStopped(f"{exc}. The run stopped; {where}. Continue with: asyncrl train --resume {run_dir}") from exc
    finally:
        if started:
            ray.shutdown()
        claimed.lock.release()
    return run_dir, summary
