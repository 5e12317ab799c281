"""The processes of a Ray run: engine, trainer-rank and reward-worker actors (plain classes here;
``launch.ray`` wraps them with ``ray.remote`` and places them).

- ``EngineWorker``: one engine of ``rollout.backend`` (built from the model directory by ``launch.stages``,
  like the local launcher's: a ``LocalEngine``, or a ``VLLMEngine`` with its own engine-core process).
  Async actor: its event loop serves ``generate`` calls concurrently while the engine decodes (in its
  own thread, or vLLM's process). ``update_weights`` takes a ``WeightUpdate`` (a safetensors
  directory) or an ``ObjectStoreUpdate`` (byte buckets read from Ray's object store). With
  ``serve(api_key, weights_root)`` (local engines) it also answers the SGLang-native HTTP protocol
  (``rollout.server``) on a port of its node, for ``launch.engine_mode=server``: behind the run's
  API key, loading weights only from the run's export directory.
- ``TrainerRank``: one rank of the FSDP2 trainer (``trainer.distributed``, SPMD mode: every rank
  runs the same calls in the same order, driven by ``launch.ray_clients.RayTrainerGroup``).
  ``export`` gathers the full weights (a collective) and, on rank 0, publishes them as object-store
  buckets or a safetensors directory.
- ``RewardWorker``: scores responses; the arithmetic verifier inline, every other verifier
  through its own one-process ``RewardService`` (sandbox, timeouts) started on first use.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from asyncrl.choices import RayWeightSync, choice_error
from asyncrl.config import Config
from asyncrl.launch.stages import (
    build_engine,
    build_reward_service,
    build_trainer,
    init_process,
    load_model,
    stage_device,
)
from asyncrl.launch.weight_buckets import ObjectStoreUpdate, pack_buckets, unpack_bucket
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Completion, TrainBatch, WeightUpdate


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


class EngineWorker:
    """One rollout engine in its own process (see the module docstring)."""

    def __init__(self, model_dir: str, cfg: Config) -> None:
        init_process(cfg)
        device = stage_device(cfg, cfg.launch.gpus_per_engine)
        # a vLLM engine loads the weights itself from a copy of this model: it is read on the CPU only
        local = cfg.rollout.backend == "local"
        model, tokenizer = load_model(cfg, model_dir, device=device if local else "cpu")
        self.engine = build_engine(cfg, model, tokenizer, device=device if local else None)
        self.engine.start()
        self._server: Any = None

    def pid(self) -> int:
        return os.getpid()

    def engine_class(self) -> str:
        """The class of the engine this actor runs (``LocalEngine``, ``VLLMEngine``)."""
        return type(self.engine).__name__

    async def serve(self, api_key: str, weights_root: str) -> str:
        """Start the HTTP front end on this node (idempotent); returns its URL. ``api_key`` (the
        run's) is required of every request; weight updates load only from ``weights_root``."""
        from asyncrl.rollout.server import EngineServer

        host = _node_ip()
        if self._server is None:
            self._server = EngineServer(self.engine, api_key=api_key, weights_root=weights_root)
            self._port = await self._server.start(host=host, port=0)
        return f"http://{host}:{self._port}"

    async def generate(self, input_ids: list[int], sampling: SamplingParams, n: int) -> list[Completion]:
        return await self.engine.generate(input_ids, sampling, n)

    async def update_weights(self, update: WeightUpdate | ObjectStoreUpdate) -> int:
        """Load ``update``; returns the engine's version afterwards."""
        if isinstance(update, ObjectStoreUpdate):
            tensors: dict[str, Any] = {}
            for ref in update.refs:  # one bucket at a time: at most one bucket beyond the weights
                meta, flat = await ref
                tensors.update(unpack_bucket(meta, flat))
            update = WeightUpdate(version=update.version, tensors=tensors)
        await self.engine.update_weights(update)
        return self.engine.version

    async def pause(self) -> None:
        await self.engine.pause()

    async def resume(self) -> None:
        await self.engine.resume()

    async def abort_all(self) -> int:
        return await self.engine.abort_all()

    def stats(self) -> dict[str, float]:
        return self.engine.stats()


class TrainerRank:
    """One FSDP2 trainer rank (see the module docstring). Calls run one at a time, in order."""

    def __init__(self, rank: int, world_size: int, model_dir: str, cfg: Config) -> None:
        self.rank, self.world_size, self.model_dir, self.cfg = rank, world_size, model_dir, cfg
        self.trainer: Any = None
        self.tokenizer: Any = None
        if cfg.launch.gpus_per_trainer > 0:
            os.environ["LOCAL_RANK"] = "0"  # Ray shows each rank only its own GPU(s)

    def rendezvous(self) -> str:
        """Rank 0: a ``tcp://ip:port`` for the process group (a free port of this node)."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"tcp://{_node_ip()}:{port}"

    def setup(self, init_method: str) -> int:
        """Join the process group and build the sharded trainer; returns its version."""
        from asyncrl.trainer.distributed import init_distributed

        init_process(self.cfg)
        backend = "nccl" if self.cfg.launch.gpus_per_trainer > 0 else "gloo"
        if self.world_size > 1:
            init_distributed(
                backend,
                self.cfg.trainer.dist_timeout_s,
                rank=self.rank,
                world_size=self.world_size,
                init_method=init_method,
            )
        device = stage_device(self.cfg, self.cfg.launch.gpus_per_trainer)
        model, self.tokenizer = load_model(self.cfg, self.model_dir, device=device)
        self.trainer = build_trainer(self.cfg, model, self.tokenizer, device=device)
        return self.trainer.version

    def pid(self) -> int:
        return os.getpid()

    def train_step(self, batch: TrainBatch) -> Any:
        return self.trainer.train_step(batch)

    def export(self, transport: RayWeightSync) -> WeightUpdate | ObjectStoreUpdate | None:
        """The current weights for the engines (rank 0; None on the others)."""
        match transport:
            case "disk":
                update = self.trainer.export_weights("safetensors")
                return update if self.rank == 0 else None
            case "object_store":
                import ray

                state = self.trainer.full_state_dict()
                if self.rank != 0:
                    return None
                buckets = pack_buckets(state, self.cfg.trainer.broadcast_bucket_mb << 20)
                refs = tuple(ray.put(b) for b in buckets)
                return ObjectStoreUpdate(self.trainer.version, refs, sum(int(b[1].nbytes) for b in buckets))
            case other:
                raise choice_error(other, RayWeightSync, "launch.weight_sync")

    def save_checkpoint(self, directory: str, extra: dict[str, Any] | None) -> None:
        self.trainer.save_checkpoint(directory, extra, self.tokenizer)

    def load_checkpoint(self, directory: str) -> tuple[dict[str, Any] | None, int]:
        extra = self.trainer.load_checkpoint(directory)
        return extra, self.trainer.version

    def save_pretrained(self, directory: str) -> None:
        self.trainer.save_pretrained(directory, self.tokenizer)

    def shutdown(self) -> None:
        from asyncrl.trainer.distributed import shutdown_distributed

        self.trainer = None
        if self.world_size > 1:
            shutdown_distributed()


class RewardWorker:
    """Scores responses (see the module docstring)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.service: Any = None

    def pid(self) -> int:
        return os.getpid()

    async def score(
        self, verifier: str, response: str, reference: str, prompt: str, row: dict[str, Any]
    ) -> tuple[float, str | None]:
        """(reward, failure reason or None)."""
        if verifier == "arithmetic":
            from asyncrl.reward.arithmetic import arithmetic_reward

            return arithmetic_reward(response, reference), None
        if self.service is None:
            self.service = build_reward_service(self.cfg, num_workers=1)
        result = await self.service.score(verifier, response, reference, prompt=prompt, row=row)
        return result.reward, result.failure

    async def close(self) -> None:
        if self.service is not None:
            await self.service.close()
