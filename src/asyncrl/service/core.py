"""The state and operations of the Tinker-compatible training service, apart from HTTP.

Owns :class:`TrainingService`: the served base models (name -> local directory), the client sessions,
the trained models (:class:`~asyncrl.service.model.TrainedModel`, each with its
:class:`~asyncrl.service.futures.SeqOrder`), the sampling sessions (each bound to one sampler
checkpoint), the futures (:class:`~asyncrl.service.futures.FutureStore`), the checkpoints on disk
(:class:`~asyncrl.service.store.CheckpointStore`) and the engines
(:class:`~asyncrl.service.sampling.EnginePool`). Each operation that the client turns into a future
returns a request id at once; its work (a model forward/backward, an optimizer step, a save) runs on a
worker thread, in the model's ``seq_id`` order. Checks that can be made before any work starts raise
``ValueError``/``KeyError`` at once (the HTTP layer answers them 400/404 naming what is wrong); what
fails later fails the future (the client's ``RequestFailedError``).

The model id of ``create_model`` is ``<session id>:train:<model seq id>`` (the client derives the same
id for a model it creates by loading a checkpoint); it is also the training run's id.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.service.futures import FutureStore, SeqOrder
from asyncrl.service.losses import check_loss
from asyncrl.service.model import AdamStep, LoraSpec, TrainedModel
from asyncrl.service.sampling import EnginePool, EngineSpec, SamplerTarget
from asyncrl.service.store import CheckpointRef, CheckpointStore, check_name, now_iso
from asyncrl.service.wire import FwdBwdRequest, encode_forward_backward_output
from asyncrl.trainer.weights import save_safetensors_dir
from asyncrl.types import WeightUpdate
from asyncrl.web.server import RawBody

__all__ = ["PROTOBUF", "ModelRecord", "TrainingService"]

PROTOBUF = "application/x-protobuf"


@dataclass
class ModelRecord:
    """One model being trained."""

    model_id: str
    base_model: str
    trained: TrainedModel
    order: SeqOrder = field(default_factory=SeqOrder)
    sampler_saves: int = 0


class TrainingService:
    """See the module docstring. ``models``: served base model name -> directory."""

    def __init__(
        self, models: dict[str, Path], root: str | Path, *, engine: EngineSpec | None = None, poll_s: float = 5.0
    ) -> None:
        if not models:
            raise ValueError("the training service needs at least one base model")
        self.served = {name: Path(d) for name, d in models.items()}
        self.store = CheckpointStore(root)
        self.futures = FutureStore(poll_s)
        self.engines = EnginePool(engine or EngineSpec())
        self.device = self.engines.spec.device
        """Where the trained models live too (``--device``)."""
        self.sessions: dict[str, dict[str, Any]] = {}
        self.models: dict[str, ModelRecord] = {}
        self.samplers: dict[str, SamplerTarget] = {}

    # ------------------------------------------------------------------------------ sessions
    def create_session(self, tags: list[str], user_metadata: dict | None) -> str:
        session_id = uuid.uuid4().hex
        self.sessions[session_id] = {
            "created": now_iso(),
            "tags": tags,
            "user_metadata": user_metadata or {},
            "heartbeat": time.time(),
        }
        return session_id

    def heartbeat(self, session_id: str) -> bool:
        """Keep a session alive; False when it has finished (the client then stops its heartbeats)."""
        session = self._session(session_id, finished_ok=True)
        session["heartbeat"] = time.time()
        return "finished" not in session

    def finish(self, session_id: str, reason: Any) -> None:
        """``ServiceClient.close``: the session takes no new models or sampling sessions (first reason wins)."""
        self._session(session_id, finished_ok=True).setdefault("finished", reason)

    def _session(self, session_id: str, *, finished_ok: bool = False) -> dict[str, Any]:
        session = self.sessions.get(session_id)
        if session is None:
            raise KeyError(f"no session {session_id!r} (sessions do not outlive a restart: create a new client)")
        if "finished" in session and not finished_ok:
            raise ValueError(f"session {session_id} has finished")
        return session

    def model(self, model_id: str) -> ModelRecord:
        record = self.models.get(model_id)
        if record is None:
            raise KeyError(f"no model {model_id!r} on this service")
        return record

    def base_dir(self, name: str) -> Path:
        if name not in self.served:
            raise ValueError(f"base_model {name!r} is not served here (served: {', '.join(self.served)})")
        return self.served[name]

    # ------------------------------------------------------------------------------ models
    def create_model(
        self, session_id: str, model_seq_id: int, base_model: str, lora: LoraSpec | None, user_metadata: dict | None
    ) -> str:
        """Start building a model; returns the request id (its result: ``CreateModelResponse``)."""
        self._session(session_id)
        base = self.base_dir(base_model)
        model_id = f"{session_id}:train:{model_seq_id}"
        if model_id in self.models:
            raise ValueError(f"model {model_id} exists (model_seq_id {model_seq_id} was already used)")

        async def work() -> dict[str, Any]:
            trained = await asyncio.to_thread(TrainedModel, base, lora, seed=model_seq_id, device=self.device)
            self._register(model_id, base_model, trained, user_metadata)
            return {"model_id": model_id, "type": "create_model"}

        return self.futures.submit("create_model", work)

    def _register(self, model_id: str, base_model: str, trained: TrainedModel, user_metadata: dict | None) -> None:
        lora = trained.lora
        self.models[model_id] = ModelRecord(model_id, base_model, trained)
        self.store.write_run(
            model_id,
            {
                "training_run_id": model_id,
                "base_model": base_model,
                "created": now_iso(),
                "lora": None if lora is None else lora.__dict__,
                "user_metadata": user_metadata or {},
                "notes": trained.notes,
            },
        )

    def info(self, model_id: str) -> dict[str, Any]:
        record = self.model(model_id)
        lora = record.trained.lora
        return {
            "type": "get_info",
            "model_id": model_id,
            "model_name": record.base_model,
            "is_lora": lora is not None,
            "lora_rank": None if lora is None else lora.rank,
            "model_data": {
                "arch": type(record.trained.hf).__name__,
                "model_name": record.base_model,
                "tokenizer_id": str(self.served[record.base_model]),
            },
        }

    def _ordered(self, kind: str, record: ModelRecord, seq_id: int | None, fn: Any, *args: Any) -> str:
        """Submit ``fn(*args)`` to run on a worker thread in the model's ``seq_id`` order."""

        async def work() -> Any:
            return await record.order.run(seq_id, lambda: asyncio.to_thread(fn, *args))

        return self.futures.submit(kind, work)

    # ------------------------------------------------------------------------------ training
    def forward_backward(self, req: FwdBwdRequest) -> str:
        record = self.model(req.model_id)
        if not req.data:
            raise ValueError("forward_backward: no data")
        for datum in req.data:
            check_loss(req.loss_fn, req.loss_fn_config, set(datum.inputs))

        def run() -> RawBody:
            outputs, metrics = record.trained.forward_backward(req)
            return RawBody(encode_forward_backward_output(outputs, metrics), PROTOBUF)

        return self._ordered("forward" if req.forward_only else "forward_backward", record, req.seq_id or None, run)

    def optim_step(self, model_id: str, seq_id: int | None, adam: AdamStep) -> str:
        record = self.model(model_id)

        def run() -> dict[str, Any]:
            return {"metrics": record.trained.optim_step(adam)}

        return self._ordered("optim_step", record, seq_id, run)

    # ------------------------------------------------------------------------------ checkpoints
    def save_weights(
        self, model_id: str, seq_id: int | None, name: str | None, overwrite: bool, user_metadata: dict | None
    ) -> str:
        record = self.model(model_id)
        ref = CheckpointRef(model_id, "weights", check_name(name) if name else f"step-{record.trained.steps:06d}")

        def run() -> dict[str, Any]:
            meta = {"steps": record.trained.steps, "user_metadata": user_metadata}
            with self.store.writing(ref, overwrite=overwrite or not name, meta=meta) as directory:
                record.trained.save(directory)
            return {"path": ref.tinker_path, "type": "save_weights"}

        return self._ordered("save_weights", record, seq_id, run)

    def load_weights(self, model_id: str, seq_id: int | None, path: str, optimizer: bool) -> str:
        """``TrainingClient.load_state``: load a training checkpoint into an existing model."""
        record = self.model(model_id)
        _, directory = self.store.existing(path)
        self._check_compatible(path, record.trained.lora, record.base_model)

        def run() -> dict[str, Any]:
            record.trained.load(directory, optimizer=optimizer)
            return {"path": path, "model_id": model_id, "type": "load_weights"}

        return self._ordered("load_weights", record, seq_id, run)

    def _check_compatible(self, path: str, lora: LoraSpec | None, base_model: str) -> dict[str, Any]:
        ref = self.store.parse(path)
        if ref.kind != "weights":
            raise ValueError(f"{path} is a sampler checkpoint; load_weights takes a training checkpoint (weights/)")
        run = self.store.read_run(ref.run_id)
        saved = run.get("lora")
        if run["base_model"] != base_model or (saved or {}).get("rank") != (None if lora is None else lora.rank):
            raise ValueError(f"{path} was trained on {run['base_model']} with lora {saved}; it does not fit this model")
        return run

    def create_from_checkpoint(
        self, session_id: str, model_seq_id: int, path: str, optimizer: bool, user_metadata: dict | None
    ) -> str:
        """``ServiceClient.create_training_client_from_state``: a new model built from a training
        checkpoint (of this service, before a restart too)."""
        self._session(session_id)
        ref, directory = self.store.existing(path)
        run = self.store.read_run(ref.run_id)
        lora = LoraSpec(**run["lora"]) if run.get("lora") else None
        self._check_compatible(path, lora, run["base_model"])
        base = self.base_dir(run["base_model"])
        model_id = f"{session_id}:train:{model_seq_id}"
        if model_id in self.models:
            raise ValueError(f"model {model_id} exists (model_seq_id {model_seq_id} was already used)")

        async def work() -> dict[str, Any]:
            def build() -> TrainedModel:
                trained = TrainedModel(base, lora, seed=model_seq_id, device=self.device)
                trained.load(directory, optimizer=optimizer)
                return trained

            trained = await asyncio.to_thread(build)
            self._register(model_id, run["base_model"], trained, {**(user_metadata or {}), "resumed_from": path})
            return {"path": path, "model_id": model_id, "type": "load_weights"}

        return self.futures.submit("load_weights", work)

    def save_for_sampler(
        self,
        model_id: str,
        seq_id: int | None,
        name: str | None,
        sampling_seq_id: int | None,
        user_metadata: dict | None,
    ) -> str:
        """Write the merged weights as a sampler checkpoint and hand the new version to the model's live
        engine (the adapters alone under LoRA, the weights otherwise); with ``sampling_seq_id``
        (``save_weights_and_get_sampling_client``) also open a sampling session."""
        record = self.model(model_id)
        if name is not None:
            check_name(name)
        session_id = model_id.split(":train:", 1)[0]

        async def run() -> dict[str, Any]:
            record.sampler_saves += 1
            ref = CheckpointRef(model_id, "sampler_weights", name or f"sampler-{record.sampler_saves:06d}")
            version = record.trained.steps
            state = await asyncio.to_thread(self._write_sampler, record, ref, version, name is None, user_metadata)
            if record.trained.lora is not None:  # the adapters only: samples in flight keep their version
                update = WeightUpdate(version, adapter=await asyncio.to_thread(record.trained.adapter_layers))
            else:
                update = WeightUpdate(version, tensors=state)
            await self.engines.publish(model_id, self.served[record.base_model], update)
            target = SamplerTarget(str(self.store.directory(ref)), version, model_id)
            sampler_id = None
            if sampling_seq_id is not None:
                sampler_id = f"{session_id}:sample:{sampling_seq_id}"
                self.samplers[sampler_id] = target
            return {"path": ref.tinker_path, "sampling_session_id": sampler_id, "type": "save_weights_for_sampler"}

        async def work() -> Any:
            return await record.order.run(seq_id, run)

        return self.futures.submit("save_weights_for_sampler", work)

    def _write_sampler(
        self, record: ModelRecord, ref: CheckpointRef, version: int, ephemeral: bool, user_metadata: dict | None
    ) -> dict[str, Any]:
        trained = record.trained
        state = trained.merged_state()
        meta = {
            "version": version,
            "ephemeral": ephemeral,
            "user_metadata": user_metadata,
            "base_model": record.base_model,
        }
        tied = dict(getattr(trained.hf, "all_tied_weights_keys", None) or {})
        with self.store.writing(ref, overwrite=ephemeral, meta=meta) as directory:
            save_safetensors_dir(state, directory, trained.hf.config, tied=tied)
            trained.tokenizer.save_pretrained(str(directory))
        return state

    # ------------------------------------------------------------------------------ sampling
    def create_sampler(self, session_id: str, seq: int, base_model: str | None, model_path: str | None) -> str:
        self._session(session_id)
        sampler_id = f"{session_id}:sample:{seq}"
        self.samplers[sampler_id] = self.target(base_model, model_path)
        return sampler_id

    def target(self, base_model: str | None, model_path: str | None) -> SamplerTarget:
        """What ``model_path`` (a sampler checkpoint) or else ``base_model`` names."""
        if model_path:
            ref, directory = self.store.existing(model_path)
            if ref.kind != "sampler_weights":
                raise ValueError(f"{model_path} is a training checkpoint; sample from a sampler_weights/ one")
            return SamplerTarget(str(directory), int(self.store.meta(ref)["version"]), ref.run_id)
        if not base_model:
            raise ValueError("sampling needs a sampling_session_id, a model_path or a base_model")
        return SamplerTarget(str(self.base_dir(base_model)), 0)

    def sampler(self, sampler_id: str) -> SamplerTarget:
        target = self.samplers.get(sampler_id)
        if target is None:
            raise KeyError(f"no sampling session {sampler_id!r}")
        return target

    def sampler_info(self, sampler_id: str) -> dict[str, Any]:
        target = self.sampler(sampler_id)
        base = next((n for n, d in self.served.items() if str(d) == target.directory), None)
        if base is None:
            base = self.store.meta(self.store.parse(self._path_of(target)))["base_model"]
        return {
            "sampler_id": sampler_id,
            "base_model": base,
            "model_path": None if target.run_id is None else self._path_of(target),
        }

    def _path_of(self, target: SamplerTarget) -> str:
        directory = Path(target.directory)
        return CheckpointRef(directory.parent.parent.name, "sampler_weights", directory.name).tinker_path

    def sample(
        self,
        target: SamplerTarget,
        prompt: list[int],
        params: dict[str, Any],
        n: int,
        *,
        prompt_logprobs: bool = False,
        last_n: int | None = None,
    ) -> tuple[str, list[str]]:
        """Start sampling (with the prompt's log-probs when asked: ``compute_logprobs``); returns
        (request id, one sequence id per sample)."""
        from asyncrl.service.wire import SampledSequence, encode_sample_response

        if last_n is not None and not (prompt_logprobs and 1 <= last_n <= len(prompt) - 1):
            raise ValueError(f"prompt_logprobs_last_n must be in [1, {len(prompt) - 1}] with prompt_logprobs")

        async def work() -> RawBody:
            scored = await self.engines.prompt_logprobs(target, prompt, last_n) if prompt_logprobs else None
            completions = await self.engines.sample(target, prompt, params, n, params.get("stop"))
            sequences = []
            for c in completions:
                if c.finish_reason == "abort":
                    raise RuntimeError("a sample was interrupted by a weight update")
                sequences.append(SampledSequence(list(c.output_ids), list(c.behav_logprobs), c.finish_reason))
            return RawBody(encode_sample_response(sequences, scored), PROTOBUF)

        request_id = self.futures.submit("sample", work)
        return request_id, [f"{request_id}:{i}" for i in range(n)]

    # ------------------------------------------------------------------------------ runs
    def training_run(self, run_id: str) -> dict[str, Any]:
        run = self.store.read_run(run_id)
        checkpoints = self.store.checkpoints(run_id)
        last = {
            kind: next((c for c in reversed(checkpoints) if c["checkpoint_type"] == kind), None)
            for kind in ("training", "sampler")
        }
        lora = run.get("lora")
        return {
            "training_run_id": run_id,
            "base_model": run["base_model"],
            "model_owner": "local",
            "is_lora": lora is not None,
            "lora_rank": None if lora is None else lora["rank"],
            "last_request_time": run["created"],
            "last_checkpoint": last["training"],
            "last_sampler_checkpoint": last["sampler"],
            "user_metadata": {str(k): str(v) for k, v in (run.get("user_metadata") or {}).items()},
        }

    async def close(self) -> None:
        await self.futures.close()
        await self.engines.close()
