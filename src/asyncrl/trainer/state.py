"""What leaves the trainer: exported weights, Hugging Face saves, and checkpoints for exact resume.

This module owns ``TrainerStateMixin``, the half of ``Trainer`` that reads or writes whole
weights (``trainer.trainer`` owns the step):

- ``full_state_dict()``: the plain Hugging Face state dict (LoRA folded in), gathered from FSDP
  shards onto rank 0.
- ``export_weights(transport)``: a ``WeightUpdate`` for the engines, as in-process tensors
  (private copies) or a safetensors directory; ``broadcast_weights(group)`` sends the same
  state in byte buckets over ``torch.distributed``. Each export is timed and logged
  (``last_export`` and the ``asyncrl.trainer`` logger).
- ``save_pretrained(dir)``: Hugging Face format (``AutoModelForCausalLM.from_pretrained`` loads
  it), tokenizer included when known.
- ``save_checkpoint(dir, extra)`` / ``load_checkpoint(dir) -> extra``: HF weights plus the full
  training state (optimizer, version, skipped steps, RNG states of every rank, the caller's
  ``extra``) for an exact resume; the format is in ``trainer.checkpoint``. The LR schedule is
  a function of the version, so restoring the version restores it. A write that fails for want of
  space raises ``storage.DiskFull`` (the half-written checkpoint is discarded by ``atomic_dir``).

Every method here is a collective under FSDP; under ``run_distributed`` the leader mirrors it.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from asyncrl.choices import WeightTransport, choice_error
from asyncrl.storage import raise_disk_full
from asyncrl.trainer import distributed as dist_mod
from asyncrl.trainer.checkpoint import (
    atomic_dir,
    capture_rng,
    read_hf_weights,
    read_trainer_state,
    restore_rng,
    write_trainer_state,
)
from asyncrl.trainer.lora import base_fingerprint, base_model, is_lora, merge_lora_state_dict
from asyncrl.trainer.weights import broadcast_state_dict, save_safetensors_dir, write_export_manifest
from asyncrl.types import WeightUpdate

logger = logging.getLogger("asyncrl.trainer")

ADAPTER_DIR = "adapter"
KEEP_EXPORTS = 2
"""Safetensors exports kept on disk (the newest ones: an engine may still be reading the previous)."""


def _nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


class TrainerStateMixin:
    """Weight export, HF saving and checkpoints of a ``Trainer`` (see the module docstring)."""

    model: Any
    optimizer: torch.optim.Optimizer
    cfg: Any
    ctx: dist_mod.DistContext | None
    rank: int
    world_size: int
    version: int
    skipped_steps: int
    tokenizer: Any
    last_export: dict[str, float | str]
    device: torch.device
    _caller_model: Any
    _export_root: Path | None = None
    _own_exports: list[Path] | None = None  # export directories this trainer wrote, oldest first

    _command: Callable[..., None]
    """``_command(name, payload=None)``: the leader's broadcast to follower ranks (``Trainer``'s)."""
    _set_lr: Callable[[int], float]
    """``_set_lr(step)``: the learning rate of a step, applied (``Trainer``'s)."""

    # ----------------------------------------------------------------- state dicts
    def _hf(self) -> Any:
        return base_model(self.model)

    def _tied(self) -> dict[str, str]:
        return dict(getattr(self._hf(), "all_tied_weights_keys", None) or {})

    def _raw_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's own state dict (LoRA names), full, on rank 0 ({} elsewhere)."""
        if self.ctx is not None:
            return dist_mod.full_state_dict(self.model)
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Plain Hugging Face state dict of the current weights (LoRA merged), private copies.
        Under FSDP: gathered on rank 0 (CPU), ``{}`` on the other ranks."""
        self._command("state_dict")
        return self._full_state_dict()

    def _full_state_dict(self) -> dict[str, torch.Tensor]:
        state = self._raw_state_dict()
        if state and is_lora(self.model):
            state = merge_lora_state_dict(state, self.model)
        return state

    # ----------------------------------------------------------------- export
    def export_weights(self, transport: WeightTransport | None = None) -> WeightUpdate:
        """The current weights for the engines, versioned: ``tensors`` (in-process, private
        copies) or ``safetensors`` (a directory under ``weight_export_dir``); default from the
        config. Under FSDP only rank 0's update carries weights."""
        transport = transport or self.cfg.weight_transport
        t0 = time.perf_counter()
        state = self.full_state_dict()
        t_gather = time.perf_counter() - t0
        nbytes = _nbytes(state)
        match transport:
            case "tensors":
                update = WeightUpdate(version=self.version, tensors=state)
            case "safetensors":
                if self.rank != 0:
                    update = WeightUpdate(version=self.version, tensors={})
                else:
                    out = self._export_dir() / f"v{self.version:08d}"
                    _, nbytes = save_safetensors_dir(state, out, self._hf().config, tied=self._tied())
                    write_export_manifest(out, self.version, time.perf_counter() - t0, nbytes)
                    self._prune_exports(out)
                    update = WeightUpdate(version=self.version, path=str(out))
            case other:
                raise choice_error(other, WeightTransport, "weight transport")
        self._record_export(transport, t0, t_gather, nbytes)
        return update

    def broadcast_weights(
        self, group: Any = None, *, src: int = 0, device: str | torch.device | None = None
    ) -> dict[str, float]:
        """Send the current weights over ``torch.distributed`` in buckets of
        ``broadcast_bucket_mb`` from this trainer's rank 0, which must be rank ``src`` of
        ``group``; every engine rank calls ``weights.receive_state_dict(src=src, group=group)``.
        Returns (and logs) the timings; other trainer ranks only help gather."""
        t0 = time.perf_counter()
        state = self.full_state_dict()
        t_gather = time.perf_counter() - t0
        metrics: dict[str, float] = {}
        if self.rank == 0:
            metrics = broadcast_state_dict(
                state,
                src=src,
                group=group,
                bucket_bytes=self.cfg.broadcast_bucket_mb << 20,
                device=device or self.device,
            )
        self._record_export("broadcast", t0, t_gather, _nbytes(state))
        return metrics

    def _record_export(self, transport: str, t0: float, t_gather: float, nbytes: int) -> None:
        seconds = time.perf_counter() - t0
        self.last_export = {
            "transport": transport,
            "version": float(self.version),
            "export_s": seconds,
            "gather_s": t_gather,
            "export_bytes": float(nbytes),
        }
        if self.rank == 0:
            logger.info(
                "weights v%d exported (%s): %.1f MB in %.3f s (gather %.3f s)",
                self.version,
                transport,
                nbytes / 1e6,
                seconds,
                t_gather,
            )

    def _export_dir(self) -> Path:
        if self._export_root is None:
            root = self.cfg.weight_export_dir
            self._export_root = Path(root) if root else Path(tempfile.mkdtemp(prefix="asyncrl-weights-"))
            self._export_root.mkdir(parents=True, exist_ok=True)
        return self._export_root

    def _prune_exports(self, written: Path) -> None:
        """Keep the newest ``KEEP_EXPORTS`` directories this trainer wrote. Only its own: another
        run's exports in the same directory (higher versions included) are not touched, and never
        make this run delete the version it just wrote."""
        if self._own_exports is None:
            self._own_exports = []
        own = self._own_exports
        if written in own:
            own.remove(written)
        own.append(written)
        while len(own) > KEEP_EXPORTS:
            shutil.rmtree(own.pop(0), ignore_errors=True)

    # ----------------------------------------------------------------- Hugging Face format
    def save_pretrained(self, directory: str | Path, tokenizer: Any = None) -> None:
        """Write the current weights in Hugging Face format (+ tokenizer: this argument, else the
        trainer's). Under FSDP rank 0 writes; every rank must call it (the leader mirrors)."""
        self._command("save_checkpoint", {"directory": str(directory), "extra": None, "weights_only": True})
        self._save_checkpoint(str(directory), None, tokenizer, weights_only=True)

    def _write_hf(self, directory: Path, merged: dict[str, torch.Tensor], tokenizer: Any) -> None:
        hf = self._hf()
        save_safetensors_dir(
            merged, directory, hf.config, tied=self._tied(), generation_config=getattr(hf, "generation_config", None)
        )
        tok = tokenizer if tokenizer is not None else self.tokenizer
        if tok is not None:
            tok.save_pretrained(str(directory))

    def _route_caller_save(self) -> None:
        """Make ``save_pretrained`` on the caller's model object write the trainer's real weights:
        after sharding (DTensor shards) or LoRA injection, the object the caller holds no longer
        saves a loadable checkpoint by itself."""
        trainer = self

        def save_pretrained(save_directory: str | Path, *args: Any, **kwargs: Any) -> None:
            trainer.save_pretrained(save_directory)

        self._caller_model.save_pretrained = save_pretrained

    # ----------------------------------------------------------------- checkpoints
    def save_checkpoint(
        self, directory: str | Path, extra: dict[str, Any] | None = None, tokenizer: Any = None
    ) -> None:
        """HF weights (+ tokenizer) and the full training state, atomically into ``directory``.

        ``extra`` is the caller's state (data position, counters), returned by
        ``load_checkpoint``; plain values only (dict, list, tuple, str, int, float, bool,
        None, tensors) so the file loads with ``weights_only=True``."""
        self._command("save_checkpoint", {"directory": str(directory), "extra": extra})
        self._save_checkpoint(str(directory), extra, tokenizer)

    def _save_checkpoint(
        self, directory: str, extra: dict[str, Any] | None = None, tokenizer: Any = None, weights_only: bool = False
    ) -> None:
        raw = self._raw_state_dict()
        lora = is_lora(self.model)
        merged = merge_lora_state_dict(raw, self.model) if (raw and lora) else raw
        if weights_only:
            if self.rank == 0:
                kept = f"{directory} is incomplete: do not load it (the run's checkpoints/ are intact)."
                with raise_disk_full(directory, kept=kept):
                    self._write_hf(Path(directory), merged, tokenizer)
            if self.ctx is not None:
                self.ctx.barrier()
            return
        optim = dist_mod.full_optimizer_state_dict(self.model, self.optimizer)
        rngs = self.ctx.all_gather_object(capture_rng()) if self.ctx is not None else [capture_rng()]
        fingerprint = self._base_fingerprint() if lora else None
        kept = f"The half-written checkpoint {directory} was discarded; the checkpoints before it are intact."
        if self.rank == 0:  # inside atomic_dir it sees the filesystem before the cleanup; outside, the manifest
            with (
                raise_disk_full(directory, kept=kept),
                atomic_dir(directory) as tmp,
                raise_disk_full(directory, kept=kept),
            ):
                self._write_hf(tmp, merged, tokenizer)
                if lora:
                    self._write_adapter(tmp / ADAPTER_DIR, raw)
                write_trainer_state(
                    tmp,
                    {
                        "version": self.version,
                        "skipped_steps": self.skipped_steps,
                        "optimizer": optim,
                        "rng": rngs,
                        "world_size": self.world_size,
                        "lora_base_fingerprint": fingerprint,
                        "lr": self.optimizer.param_groups[0]["lr"],
                        "extra": extra,
                    },
                )
        if self.ctx is not None:
            self.ctx.barrier()

    def _write_adapter(self, directory: Path, raw: dict[str, torch.Tensor]) -> None:
        """The adapters in ``peft``'s own format (``PeftModel.from_pretrained`` loads them)."""
        from safetensors.torch import save_file

        directory.mkdir(parents=True, exist_ok=True)
        adapter = {k.replace(".default.", "."): v.contiguous() for k, v in raw.items() if ".lora_" in k}
        save_file(adapter, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
        self.model.peft_config["default"].save_pretrained(str(directory))

    def _base_fingerprint(self) -> float:
        local = base_fingerprint(self.model)
        return self.ctx.all_reduce([local])[0] if self.ctx is not None else local

    def load_checkpoint(self, directory: str | Path) -> dict[str, Any] | None:
        """Restore weights, optimizer, version and RNG states saved by ``save_checkpoint``;
        returns its ``extra``. With LoRA, build the trainer from the original base model (the
        checkpoint's HF weights are merged; the adapters are restored from ``adapter/``)."""
        self._command("load_checkpoint", str(directory))
        return self._load_checkpoint(str(directory))

    def _load_checkpoint(self, directory: str) -> dict[str, Any] | None:
        state = read_trainer_state(directory) if self.rank == 0 else {}
        meta = {k: v for k, v in state.items() if k != "optimizer"}
        if self.ctx is not None:
            meta = self.ctx.broadcast_object(meta)
        if is_lora(self.model):
            self._load_adapter(Path(directory), meta.get("lora_base_fingerprint"))
        else:
            self._load_weights(read_hf_weights(directory) if self.rank == 0 else {})
        dist_mod.load_full_optimizer_state_dict(
            self.model, self.optimizer, state.get("optimizer", {}), from_rank0=self.ctx is not None
        )
        self.version = int(meta["version"])
        self.skipped_steps = int(meta["skipped_steps"])
        rngs = meta["rng"]
        restore_rng(rngs[self.rank] if len(rngs) == self.world_size else rngs[0])
        self._set_lr(self.version)
        return meta.get("extra")

    def _load_weights(self, state: dict[str, torch.Tensor], *, strict_keys: bool = True) -> None:
        """Full state dict on rank 0 (``{}`` elsewhere) -> every rank's weights. Keys missing from
        ``state`` may only be tied copies; unknown keys are errors."""
        if self.rank == 0 and strict_keys:
            own = set(self.model.state_dict())
            unknown = sorted(set(state) - own)
            missing = sorted(own - set(state) - set(self._tied()))
            if unknown or missing:
                raise KeyError(f"checkpoint does not match the model: unknown {unknown[:5]}, missing {missing[:5]}")
        if self.ctx is not None:
            dist_mod.load_full_state_dict(self.model, state, strict=False)
        else:
            with torch.no_grad():
                self.model.load_state_dict(state, strict=False)

    def _load_adapter(self, directory: Path, fingerprint: float | None) -> None:
        from safetensors.torch import load_file

        current = self._base_fingerprint()
        if fingerprint is None or abs(current - fingerprint) > 1e-6 * max(1.0, abs(fingerprint)):
            raise ValueError(
                "LoRA resume: the trainer's base weights differ from the checkpoint's base. Build the "
                "trainer from the original base model, not from the checkpoint's merged weights."
            )
        state: dict[str, torch.Tensor] = {}
        if self.rank == 0:
            for key, value in load_file(str(directory / ADAPTER_DIR / "adapter_model.safetensors")).items():
                for part in (".lora_A.", ".lora_B."):
                    key = key.replace(part, f"{part}default.")
                state[key] = value
            own = {k for k in self.model.state_dict() if ".lora_" in k}
            if set(state) != own:
                diff = sorted(own ^ set(state))[:5]
                raise KeyError(f"adapter checkpoint does not match the model's adapters: {diff}")
        if self.ctx is not None:
            dist_mod.load_full_state_dict(self.model, state, strict=False)
        else:
            with torch.no_grad():
                self.model.load_state_dict(state, strict=False)
