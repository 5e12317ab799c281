"""Whether a run fits in its devices' memory, estimated before anything is loaded: ``asyncrl train`` refuses
a run that cannot fit, ``asyncrl plan`` shows the same estimate.

Owns ``ModelShape`` (what the estimate reads of a model: parameters, the KV cache's dimensions, the vocabulary,
the linear layers LoRA adapts; from a model directory's ``config.json`` instantiated on the ``meta`` device, so
no weight is read, or from the tiny default's ``sft.*`` shape), ``estimate_memory`` (the parts each device holds:
the engine's weights and KV cache, per trainer rank the parameters, gradients and Adam's two moments, LoRA
adapters where ``trainer.lora_rank`` > 0, the frozen reference of ``algo.kl_coef`` > 0, one micro-batch's fp32
logits and their gradient), ``check_memory`` (each device's total against what is available there:
``rollout.memory.available_bytes`` or an injected figure) and ``require_memory_fits``, which raises
``MemoryTooSmall`` (a ``ConfigError``: one line) naming the numbers of the first device that cannot hold them.

Placement follows the launchers: ``launch.kind=local`` puts the engine and the trainer on ``model.device``
(``launch.engine_urls``: the engines are servers elsewhere, not counted); ``launch.kind=ray`` puts each engine on
its own GPU(s) when ``launch.gpus_per_engine`` > 0 and each trainer rank on its own when ``launch.gpus_per_trainer``
> 0, everything else in this machine's memory. Activations other than the logits (a layer's, the sampler's,
the allocator's slack) are not counted; a device whose free memory cannot be read is not checked.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.config import Config, ConfigError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
LORA_BYTES = 4
"""peft keeps adapters in float32 whatever the base model's dtype (``autocast_adapter_dtype``)."""
LOGITS_COPIES = 2
"""One micro-batch's logits in float32 and their gradient."""

Available = Callable[[str], "tuple[int, str] | None"]
"""A device (``cpu``, ``cuda:0``) -> (bytes available there, where that figure comes from); None: unknown."""


class MemoryTooSmall(ConfigError):
    """The run's estimated memory does not fit on one of its devices."""


@dataclass(frozen=True)
class ModelShape:
    """What the estimate reads of a model."""

    params: int
    """Distinct parameters (tied weights once)."""
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_positions: int
    linears: tuple[tuple[str, int, int], ...] = ()
    """(module name, in features, out features) of every linear layer but the output head: what LoRA adapts."""

    def lora_params(self, rank: int, targets: str) -> int:
        """Parameters of rank-``rank`` adapters (A: in x r, B: r x out) on ``targets`` (``all-linear`` or
        comma-separated module names, matched on the name's last part, as peft does)."""
        names = {t.strip() for t in targets.split(",") if t.strip()}
        chosen = [lin for lin in self.linears if targets == "all-linear" or lin[0].rsplit(".", 1)[-1] in names]
        return sum(rank * (n_in + n_out) for _, n_in, n_out in chosen)


def shape_of_hf_config(hf_config: Any) -> ModelShape:
    """The ``ModelShape`` of a transformers config: the model built on the ``meta`` device (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    heads = int(text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    out = model.get_output_embeddings()
    linears = tuple(
        (name, int(m.in_features), int(m.out_features))
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and m is not out
    )
    return ModelShape(
        params=sum(p.numel() for p in model.parameters()),
        layers=int(text.num_hidden_layers),
        kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=head_dim,
        vocab=int(text.vocab_size),
        max_positions=int(getattr(text, "max_position_embeddings", 0) or 0),
        linears=linears,
    )


def model_shape(cfg: Config, model_dir: str | Path | None = None) -> ModelShape | None:
    """The shape of ``model_dir`` (default ``model.path``), or of the tiny default built from ``sft.*`` when
    neither is set; None when the directory has no readable ``config.json`` (loading it reports that)."""
    from transformers import AutoConfig

    path = model_dir or cfg.model.path
    if path:
        if not (Path(path) / "config.json").is_file():
            return None
        try:
            return shape_of_hf_config(AutoConfig.from_pretrained(str(path)))
        except Exception:  # noqa: BLE001 - an unknown or damaged config: load_policy says so in one line
            return None
    from transformers import LlamaConfig

    from asyncrl.models import TINY_CHARACTERS, TINY_SPECIAL_TOKENS, tiny_spec

    spec = tiny_spec(cfg.sft)
    vocab = len(dict.fromkeys((*TINY_SPECIAL_TOKENS, *TINY_CHARACTERS)))  # build_tiny_tokenizer's vocabulary

    return shape_of_hf_config(
        LlamaConfig(
            vocab_size=vocab,
            hidden_size=spec.hidden_size,
            intermediate_size=spec.intermediate_size,
            num_hidden_layers=spec.num_layers,
            num_attention_heads=spec.num_heads,
            num_key_value_heads=spec.num_kv_heads,
            max_position_embeddings=spec.max_position_embeddings,
            tie_word_embeddings=True,
        )
    )


@dataclass(frozen=True)
class MemoryPart:
    """One thing a device holds."""

    name: str
    bytes: int
    formula: str
    """How ``bytes`` was counted, in words and numbers."""


@dataclass(frozen=True)
class DeviceNeed:
    """What one device holds (``count`` devices alike: each of them holds it)."""

    device: str
    """``cpu``, ``cuda``, ``cuda:N``: where availability is read."""
    role: str
    parts: tuple[MemoryPart, ...]
    count: int = 1

    @property
    def total(self) -> int:
        return sum(p.bytes for p in self.parts)


@dataclass(frozen=True)
class MemoryEstimate:
    devices: tuple[DeviceNeed, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeviceVerdict:
    need: DeviceNeed
    available: int | None
    """Bytes available on the device; None: unknown, not checked."""
    source: str = ""

    @property
    def fits(self) -> bool | None:
        return None if self.available is None else self.need.total <= self.available


@dataclass(frozen=True)
class MemoryCheck:
    estimate: MemoryEstimate
    verdicts: tuple[DeviceVerdict, ...] = field(default_factory=tuple)

    @property
    def failing(self) -> DeviceVerdict | None:
        return next((v for v in self.verdicts if v.fits is False), None)


def gib(n: float) -> str:
    """Bytes in GiB (MiB below one GiB)."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


VLLM_COPY = "launcher's copy of the weights"
"""The weights a vLLM engine's builder reads (in the launcher's process, or on the host of a Ray engine actor)
and saves for vLLM to load."""


def _engine_parts(cfg: Config, shape: ModelShape) -> tuple[MemoryPart, ...]:
    """One engine's weights and KV cache (``rollout.backend``); nothing for servers elsewhere."""
    from asyncrl.launch.stages import engine_max_seq_len

    r, dtype = cfg.rollout, cfg.model.dtype
    size = DTYPE_BYTES[dtype]
    weights = MemoryPart("engine weights", shape.params * size, f"{shape.params:,} params x {size} B ({dtype})")
    seq = engine_max_seq_len(cfg)
    if r.backend == "local":
        kv = 2 * shape.layers * (r.max_slots + 1) * shape.kv_heads * seq * shape.head_dim * size
        formula = (
            f"2 (K, V) x {shape.layers} layers x {r.max_slots + 1} slots x {shape.kv_heads} KV heads x "
            f"{seq} tokens x head_dim {shape.head_dim} x {size} B"
        )
        return weights, MemoryPart("engine KV cache", kv, formula)
    if r.backend == "vllm":
        from asyncrl.rollout.vllm_engine import VLLMEngine

        kv_gib = float(inspect.signature(VLLMEngine).parameters["kv_cache_gib"].default)
        kv = MemoryPart("engine KV cache", int(kv_gib * 2**30), f"vLLM's kv_cache_memory_bytes ({kv_gib:g} GiB)")
        copy = MemoryPart(VLLM_COPY, weights.bytes, weights.formula + ", handed to vLLM")
        return weights, kv, copy
    return ()  # a server's memory is its own


def _trainer_parts(cfg: Config, shape: ModelShape, ranks: int) -> tuple[MemoryPart, ...]:
    """One trainer rank's states: FSDP2 shards parameters, gradients and moments over ``ranks``."""
    t, dtype = cfg.trainer, cfg.model.dtype
    size = DTYPE_BYTES[dtype]
    per = f" / {ranks} ranks" if ranks > 1 else ""
    parts = [MemoryPart("trainer parameters", shape.params * size // ranks, f"{shape.params:,} x {size} B{per}")]
    if t.lora_rank > 0:
        lora = shape.lora_params(t.lora_rank, t.lora_target_modules)
        trainable, tsize = lora, LORA_BYTES
        parts.append(MemoryPart("LoRA adapters", lora * tsize // ranks, f"{lora:,} (rank {t.lora_rank}) x 4 B{per}"))
    else:
        trainable, tsize = shape.params, size
    parts.append(MemoryPart("gradients", trainable * tsize // ranks, f"{trainable:,} trainable x {tsize} B{per}"))
    parts.append(
        MemoryPart("Adam moments", 2 * trainable * tsize // ranks, f"2 x {trainable:,} trainable x {tsize} B{per}")
    )
    if cfg.algo.kl_coef > 0:
        parts.append(MemoryPart("KL reference", shape.params * size, f"{shape.params:,} x {size} B (a full copy)"))
    if t.micro_batching == "packed":
        tokens = t.max_tokens_per_micro_batch
    else:
        from asyncrl.launch.stages import engine_max_seq_len

        tokens = t.padded_micro_batch_size * engine_max_seq_len(cfg)
    parts.append(
        MemoryPart(
            "logits of a micro-batch",
            LOGITS_COPIES * tokens * shape.vocab * 4,
            f"{LOGITS_COPIES} (fp32 logits, gradient) x {tokens:,} tokens x vocab {shape.vocab:,} x 4 B",
        )
    )
    return tuple(parts)


def trainer_ranks(cfg: Config) -> int:
    """Data-parallel trainer ranks: ``launch.trainer_ranks`` under Ray, ``WORLD_SIZE`` under torchrun."""
    if cfg.launch.kind == "ray":
        return max(1, cfg.launch.trainer_ranks)
    return max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))


def _per_gpu(fraction: float) -> int:
    """Actors that share one GPU when each asks for ``fraction`` of one (Ray packs them)."""
    return max(1, math.floor(1 / fraction + 1e-9)) if fraction < 1 else 1


def _times(parts: tuple[MemoryPart, ...], n: int) -> tuple[MemoryPart, ...]:
    return tuple(MemoryPart(f"{p.name} x {n}", p.bytes * n, p.formula) for p in parts)


def estimate_memory(cfg: Config, shape: ModelShape) -> MemoryEstimate:
    """The parts each device of this run holds (see the module docstring for the placement)."""
    ranks = trainer_ranks(cfg)
    remote = bool(cfg.launch.engine_urls) or cfg.rollout.backend not in ("local", "vllm")
    engine = () if remote else _engine_parts(cfg, shape)
    trainer = _trainer_parts(cfg, shape, ranks)
    notes = ["activations beyond one micro-batch's logits, and the allocator's slack, are not counted"]
    if remote:
        urls = " with launch.engine_urls" if cfg.launch.engine_urls else ""
        notes.append(
            f"rollout.backend={cfg.rollout.backend}{urls}: the engines are servers elsewhere, their memory not counted"
        )
    if cfg.rollout.backend == "vllm" and cfg.model.device.startswith("cuda"):
        share = cfg.rollout.gpu_memory_fraction or 0.9
        notes.append(
            f"vLLM asks at start for {share:g} of the GPU's total memory free (rollout.gpu_memory_fraction, "
            "vLLM's default 0.9), whatever else the estimate counts there"
        )
    if cfg.launch.kind != "ray":
        role = "engine + trainer" + (f" (rank 0 of {ranks})" if ranks > 1 else "")
        return MemoryEstimate((DeviceNeed(cfg.model.device, role, engine + trainer),), tuple(notes))
    la, engines = cfg.launch, cfg.rollout.num_engines
    devices: list[DeviceNeed] = []
    host: list[MemoryPart] = []
    if la.gpus_per_engine > 0:
        # a vLLM engine actor reads its copy of the weights on its host; its shards go to its GPUs
        host += _times(tuple(p for p in engine if p.name == VLLM_COPY), engines)
        engine = tuple(p for p in engine if p.name != VLLM_COPY)
        tp = cfg.rollout.tensor_parallel_size if cfg.rollout.backend == "vllm" else 1
        if tp > 1:  # gpus_per_engine >= tp (config check): one shard of the weights, and its KV cache, per GPU
            parts = tuple(
                MemoryPart(p.name, p.bytes // tp, f"{p.formula} / {tp} shards") if p.name == "engine weights" else p
                for p in engine
            )
            devices.append(DeviceNeed("cuda", f"engine GPU (1 of {tp} shards each)", parts, engines * tp))
        else:
            share = min(engines, _per_gpu(la.gpus_per_engine))
            parts = _times(engine, share) if share > 1 else engine
            devices.append(
                DeviceNeed("cuda", f"engine GPU ({share} engine(s) each)", parts, math.ceil(engines / share))
            )
    else:
        host += _times(engine, engines)
    if la.gpus_per_trainer > 0:
        devices.append(DeviceNeed("cuda", "trainer rank GPU", trainer, ranks))
    else:
        host += _times(trainer, ranks)
    if host:
        devices.insert(0, DeviceNeed("cpu", "this machine (Ray actors without GPUs)", tuple(host)))
    return MemoryEstimate(tuple(devices), tuple(notes))


def default_available(device: str) -> tuple[int, str] | None:
    """``rollout.memory.available_bytes``: CUDA's free memory, or this machine's available RAM."""
    from asyncrl.rollout.memory import available_bytes

    try:
        return available_bytes(device)
    except (RuntimeError, AssertionError):  # a CUDA device this process cannot open: unknown
        return None


def check_memory(estimate: MemoryEstimate, available: Available | None = None) -> MemoryCheck:
    """Each device's total against what ``available`` (default ``default_available``) reports for it."""
    available = available or default_available
    verdicts = []
    for need in estimate.devices:
        found = available(need.device)
        verdicts.append(DeviceVerdict(need, *found) if found is not None else DeviceVerdict(need, None))
    return MemoryCheck(estimate, tuple(verdicts))


def describe(check: MemoryCheck) -> list[str]:
    """The estimate as lines: per device its total, its parts and the verdict."""
    lines = []
    for v in check.verdicts:
        n = v.need
        many = f" (x{n.count})" if n.count > 1 else ""
        verdict = "not checked (free memory unknown)"
        if v.fits is not None:
            verdict = f"{'fits' if v.fits else 'DOES NOT FIT'} in {gib(v.available or 0)} available ({v.source})"
        lines.append(f"{n.role} on {n.device}{many}: {gib(n.total)}; {verdict}")
        lines += [f"    {p.name:<34} {gib(p.bytes):>11}  {p.formula}" for p in n.parts]
    lines += [f"  note: {note}" for note in check.estimate.notes]
    return lines


def refusal(v: DeviceVerdict) -> str:
    """The one line of a run that does not fit on ``v``'s device."""
    n = v.need
    largest = sorted(n.parts, key=lambda p: -p.bytes)[:3]
    return (
        f"this run does not fit in memory: the {n.role} on {n.device} needs about {gib(n.total)} ("
        + ", ".join(f"{p.name} {gib(p.bytes)}" for p in largest)
        + f"{', ...' if len(n.parts) > 3 else ''}) but {gib(v.available or 0)} is available ({v.source}). "
        "Lower rollout.max_slots or max_prompt_len/max_new_tokens (KV cache), use trainer.lora_rank > 0 or more "
        "trainer ranks (trainer states), model.dtype=bfloat16, or a smaller model; `asyncrl plan` shows the estimate"
    )


def require_memory_fits(
    cfg: Config, model_dir: str | Path | None = None, available: Available | None = None
) -> MemoryCheck | None:
    """Raise ``MemoryTooSmall`` when the run's estimate exceeds a device's available memory; the check
    otherwise (None: the model's shape could not be read, nothing checked)."""
    shape = model_shape(cfg, model_dir)
    if shape is None:
        return None
    check = check_memory(estimate_memory(cfg, shape), available)
    bad = check.failing
    if bad is not None:
        raise MemoryTooSmall(refusal(bad))
    return check


def fits_line(v: DeviceVerdict) -> str:
    """A device's estimate in a few words (what ``asyncrl train`` prints at start)."""
    where = f"{v.need.role} on {v.need.device}"
    if v.available is None:
        return f"{where} about {gib(v.need.total)} (free memory unknown)"
    return f"{where} about {gib(v.need.total)} of {gib(v.available)} available"
