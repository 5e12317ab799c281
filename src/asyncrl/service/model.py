"""One trained model of the Tinker-compatible service: the policy, its optimizer, its steps.

Owns :class:`TrainedModel`: a Hugging Face causal LM loaded from a served base model's directory,
wrapped with LoRA adapters of the client's rank (the project's :mod:`asyncrl.trainer.lora`, on
``peft``) or trained whole (full fine-tuning, a ``create_model`` without ``lora_config``), and an AdamW
optimizer whose hyperparameters each ``optim_step`` sets from the client's ``AdamParams``. It computes
``forward_backward`` (gradients accumulate until the next ``optim_step``, as in Tinker), exports the
merged weights for sampler checkpoints and, under LoRA, the adapters alone for the engines, and
saves/loads its trainable state (weights and optimizer) for checkpoints. Every method here is
synchronous and runs on a worker thread; the caller orders them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asyncrl.config import TrainerConfig
from asyncrl.models import load_policy
from asyncrl.service.losses import check_loss, tinker_loss
from asyncrl.service.wire import FwdBwdDatum, FwdBwdRequest
from asyncrl.trainer.lora import adapter_layers, apply_lora, base_model, is_lora, merge_lora_state_dict

__all__ = ["AdamStep", "LoraSpec", "TrainedModel"]

ADAM_KEYS = ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")


@dataclass(frozen=True)
class LoraSpec:
    """The client's ``LoraConfig``."""

    rank: int
    seed: int | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True


@dataclass(frozen=True)
class AdamStep:
    """The client's ``AdamParams`` (Tinker's defaults)."""

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


def _targets(model: Any, lora: LoraSpec) -> tuple[str, list[str]]:
    """(peft ``target_modules`` names, notes): the linear layers of attention and/or MLP, plus the
    unembedding when asked and not tied to the input embedding (an adapter there would change both)."""
    names: set[str] = set()
    for full, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        leaf = full.rsplit(".", 1)[-1]
        if ("attn" in full or "attention" in full) and lora.train_attn:
            names.add(leaf)
        elif "mlp" in full and lora.train_mlp:
            names.add(leaf)
    notes = []
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    if lora.train_unembed and not tied:
        names.add("lm_head")
    elif lora.train_unembed:
        notes.append("train_unembed: the unembedding is tied to the input embedding here, so it stays frozen")
    if not names:
        raise ValueError("lora_config selects no layer of this model (train_attn and train_mlp are both false)")
    return ",".join(sorted(names)), notes


class TrainedModel:
    """A policy being trained through the service (see the module docstring)."""

    def __init__(self, base_dir: str | Path, lora: LoraSpec | None, *, seed: int = 0, device: str = "cpu") -> None:
        torch.manual_seed(seed if lora is None or lora.seed is None else lora.seed)
        self.device = torch.device(device)
        model, tokenizer = load_policy(base_dir, device=device)
        self.tokenizer = tokenizer
        self.lora = lora
        self.notes: list[str] = []
        if lora is not None:
            if lora.rank < 1:
                raise ValueError(f"lora_config.rank must be >= 1, got {lora.rank}")
            targets, self.notes = _targets(model, lora)
            cfg = dataclasses.replace(
                TrainerConfig(),
                lora_rank=lora.rank,
                lora_target_modules=targets,
                seed=lora.seed if lora.seed is not None else seed,
            )
            model = apply_lora(model, cfg)
        self.model = model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=AdamStep.learning_rate, foreach=False)
        self.steps = 0
        """Optimizer steps taken (the policy version of the weights)."""
        self.pending_datums = 0
        """Datums whose gradients wait for the next ``optim_step``."""

    @property
    def hf(self) -> Any:
        """The plain transformers model (under the LoRA wrapper when there is one)."""
        return base_model(self.model)

    # ------------------------------------------------------------------------------ training
    def forward_backward(self, req: FwdBwdRequest) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        """Per-datum outputs (``logprobs`` of the target tokens; ``elementwise_loss`` for
        cross-entropy) and metrics (``loss:sum``); gradients accumulate unless ``forward_only``."""
        if not req.data:
            raise ValueError("forward_backward: no data")
        configs = [check_loss(req.loss_fn, req.loss_fn_config, set(d.inputs)) for d in req.data]
        config = configs[0]  # the same for every datum (the request's)
        outputs: list[dict[str, np.ndarray]] = []
        total = 0.0
        for datum in req.data:
            with torch.set_grad_enabled(not req.forward_only):
                logp, inputs = self._logprobs(datum)
                loss = tinker_loss(req.loss_fn, config, logp, inputs)
                if not req.forward_only:
                    loss.backward()
            out = {"logprobs": logp.detach().float().cpu().numpy()}
            if req.loss_fn == "cross_entropy":
                out["elementwise_loss"] = (-(inputs["weights"] * logp.detach())).float().cpu().numpy()
            outputs.append(out)
            total += float(loss.detach())
        if not req.forward_only:
            self.pending_datums += len(req.data)
        return outputs, {"loss:sum": total}

    def _logprobs(self, datum: FwdBwdDatum) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The current log-probs of ``target_tokens`` at every position of the datum's input."""
        n = len(datum.tokens)
        if n == 0:
            raise ValueError("a datum's model_input is empty")
        vocab = int(self.hf.config.vocab_size)
        inputs = {k: torch.from_numpy(np.asarray(v)) for k, v in datum.inputs.items()}
        for name, t in inputs.items():
            if t.numel() != n:
                raise ValueError(f"loss_fn_inputs[{name!r}] has {t.numel()} values for {n} input tokens")
        ids = torch.tensor(datum.tokens, dtype=torch.long)
        targets = inputs["target_tokens"].long().reshape(-1)
        for what, t in (("model_input", ids), ("target_tokens", targets)):
            if int(t.min()) < 0 or int(t.max()) >= vocab:
                raise ValueError(f"{what} holds a token id outside the vocabulary [0, {vocab})")
        logits = self.model(input_ids=ids.unsqueeze(0).to(self.device)).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, targets.to(self.device).unsqueeze(-1)).squeeze(-1)
        floats = {k: v.reshape(-1).float().to(self.device) for k, v in inputs.items() if k != "target_tokens"}
        return logp, floats

    def optim_step(self, step: AdamStep) -> dict[str, float]:
        """One AdamW step with the client's hyperparameters on the accumulated gradients, then zero them."""
        for key in ADAM_KEYS:
            value = getattr(step, key)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"adam_params.{key} must be a finite number >= 0, got {value!r}")
        if not (step.beta1 < 1 and step.beta2 < 1):
            raise ValueError("adam_params.beta1 and beta2 must be < 1")
        for group in self.optimizer.param_groups:
            group.update(lr=step.learning_rate, betas=(step.beta1, step.beta2), eps=step.eps)
            group["weight_decay"] = step.weight_decay
        limit = step.grad_clip_norm if step.grad_clip_norm > 0 else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, limit))  # the norm before clipping
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        self.pending_datums = 0
        return {"grad_norm:mean": norm, "learning_rate:mean": step.learning_rate}

    # ------------------------------------------------------------------------------ weights
    def merged_state(self) -> dict[str, torch.Tensor]:
        """The plain model's weights (adapters folded in), detached copies, Hugging Face names."""
        with torch.no_grad():
            state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return merge_lora_state_dict(state, self.model) if is_lora(self.model) else state

    def adapter_layers(self) -> dict[str, tuple[torch.Tensor, torch.Tensor, float]]:
        """The LoRA adapters alone, ``{HF layer name: (A, B, scaling)}`` (``WeightUpdate.adapter``); a model
        trained whole has none (``ValueError``)."""
        if not is_lora(self.model):
            raise ValueError("a fully fine-tuned model has no adapters")
        return adapter_layers(self.model)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The trained tensors only (the adapters under LoRA, every weight otherwise), by parameter name."""
        return {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}

    def save(self, directory: Path, *, optimizer: bool = True) -> int:
        """Write the trainable weights (``weights.safetensors``) and the optimizer's state; returns bytes written."""
        from safetensors.torch import save_file

        tensors = {k: v.contiguous().cpu() for k, v in self.trainable_state().items()}
        save_file(tensors, str(directory / "weights.safetensors"))
        torch.save(
            {"steps": self.steps, "optimizer": self.optimizer.state_dict() if optimizer else None},
            directory / "optimizer.pt",
        )
        return sum(f.stat().st_size for f in directory.iterdir() if f.is_file())

    def load(self, directory: Path, *, optimizer: bool) -> None:
        """Load what :meth:`save` wrote (the optimizer's state only when ``optimizer``); every name and
        shape is checked before the first copy."""
        from safetensors.torch import load_file

        tensors = load_file(str(directory / "weights.safetensors"))
        own = dict(self.model.named_parameters())
        wrong = [k for k, v in tensors.items() if k not in own or tuple(own[k].shape) != tuple(v.shape)]
        missing = [k for k, p in own.items() if p.requires_grad and k not in tensors]
        if wrong or missing:
            raise ValueError(f"checkpoint {directory.name} does not fit this model (e.g. {(wrong + missing)[:3]})")
        with torch.no_grad():
            for k, v in tensors.items():
                own[k].copy_(v)
        meta = torch.load(directory / "optimizer.pt", weights_only=True, map_location=self.device)
        if optimizer:
            if meta.get("optimizer") is None:
                raise ValueError(f"checkpoint {directory.name} was saved without optimizer state")
            self.optimizer.load_state_dict(meta["optimizer"])
            self.steps = int(meta["steps"])
        self.optimizer.zero_grad(set_to_none=True)
        self.pending_datums = 0
