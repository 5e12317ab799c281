"""LoRA through ``peft``: wrap the policy, and fold adapters into plain weights for export.

This module owns the two places the trainer meets ``peft`` (an optional dependency, imported
only when ``trainer.lora_rank > 0``):

- ``apply_lora(model, cfg)``: wrap a transformers causal LM with LoRA adapters (only the
  adapters train); the adapter initialisation draws from its own seeded generator so enabling
  LoRA does not shift the global RNG stream.
- ``merge_lora_state_dict(state, model)``: turn a state dict of the wrapped model (adapter
  tensors, ``base_layer`` names) into the state dict of the plain model with
  ``W + scaling · B @ A`` folded in, under the original Hugging Face names. The wrapped model
  itself is never merged in place (merge/unmerge round trips drift in floating point).
- ``adapter_layers(model)``: the adapters alone, ``{HF name of the layer: (A, B, scaling)}``, for an
  adapter-only weight update (``WeightUpdate.adapter``): a fraction of the merged weights' bytes.
"""

from __future__ import annotations

from typing import Any

import torch

from asyncrl.config import TrainerConfig

PEFT_PREFIX = "base_model.model."


def is_lora(model: Any) -> bool:
    """True for a ``peft`` model (LoRA-wrapped)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def base_model(model: Any) -> Any:
    """The plain transformers model under a ``peft`` wrapper (the model itself otherwise)."""
    return model.get_base_model() if is_lora(model) else model


def apply_lora(model: Any, cfg: TrainerConfig) -> Any:
    """Wrap ``model`` with LoRA adapters of rank ``cfg.lora_rank`` (``peft`` must be installed)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("trainer.lora_rank > 0 needs peft: pip install 'asyncrl[lora]' (or peft)") from exc
    targets: str | list[str]
    if cfg.lora_target_modules.strip() == "all-linear":
        targets = "all-linear"
    else:
        targets = [t.strip() for t in cfg.lora_target_modules.split(",") if t.strip()]
    lora_cfg = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return get_peft_model(model, lora_cfg)


def _lora_modules(model: Any) -> dict[str, Any]:
    """State-dict prefix of every LoRA-adapted layer -> the layer."""
    from peft.tuners.lora import LoraLayer

    return {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}


def merge_lora_state_dict(state: dict[str, torch.Tensor], model: Any) -> dict[str, torch.Tensor]:
    """Plain Hugging Face state dict with every adapter folded into its base weight.

    ``state`` is a full state dict of the ``peft``-wrapped ``model`` (e.g. gathered from FSDP
    shards); the result has the base model's names and no adapter tensors."""
    modules = _lora_modules(model)
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if ".lora_" in key:
            continue
        name = key
        if ".base_layer." in key:
            prefix, param = key.split(".base_layer.", 1)
            module = modules.get(prefix)
            if module is None:
                raise KeyError(f"{key}: no LoRA layer named {prefix}")
            if param == "weight":
                for adapter in module.active_adapters:
                    if adapter not in module.lora_A:
                        continue
                    a = state[f"{prefix}.lora_A.{adapter}.weight"].float()
                    b = state[f"{prefix}.lora_B.{adapter}.weight"].float()
                    delta = (b @ a) * float(module.scaling[adapter])
                    if getattr(module, "fan_in_fan_out", False):
                        delta = delta.T
                    value = (value.float() + delta.to(value.device)).to(value.dtype)
            name = f"{prefix}.{param}"
        if name.startswith(PEFT_PREFIX):
            name = name[len(PEFT_PREFIX) :]
        out[name] = value
    return out


def adapter_layers(model: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor, float]]:
    """Detached copies of the active adapters of a ``peft`` model, by the Hugging Face name of the layer
    they adapt (``model.layers.0.self_attn.q_proj``): ``(A [r, in], B [out, r], scaling)``. Several active
    adapters on one layer are stacked along the rank, their scalings folded into B (then 1.0)."""
    out: dict[str, tuple[torch.Tensor, torch.Tensor, float]] = {}
    with torch.no_grad():
        for prefix, module in _lora_modules(model).items():
            factors = []
            for adapter in module.active_adapters:
                if adapter not in module.lora_A:
                    continue
                if getattr(module, "use_dora", {}).get(adapter, False):
                    raise ValueError(f"{prefix}: DoRA adapters are not plain low-rank deltas")
                if getattr(module, "fan_in_fan_out", False):
                    raise ValueError(f"{prefix}: fan_in_fan_out layers are not supported")
                a = module.lora_A[adapter].weight.detach().clone()
                b = module.lora_B[adapter].weight.detach().clone()
                factors.append((a, b, float(module.scaling[adapter])))
            if not factors:
                continue
            name = prefix[len(PEFT_PREFIX) :] if prefix.startswith(PEFT_PREFIX) else prefix
            if len(factors) == 1:
                out[name] = factors[0]
            else:
                a = torch.cat([f[0] for f in factors], 0)
                b = torch.cat([f[1] * f[2] for f in factors], 1)
                out[name] = (a, b, 1.0)
    return out


def base_fingerprint(model: Any) -> float:
    """A cheap checksum of the frozen base weights (detects resuming on the wrong base model)."""
    total = 0.0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                continue
            local = p.to_local() if hasattr(p, "to_local") else p
            total += float(local.double().abs().sum()) if local.numel() else 0.0
    return total
