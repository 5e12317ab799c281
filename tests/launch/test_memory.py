"""The memory feasibility estimate (``launch.memory``): its counts against real models, its placement per
launcher, and ``asyncrl train`` refusing in one line, before any model is built, on a fake device memory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncrl.cli import main
from asyncrl.config import load_config
from asyncrl.launch import memory
from asyncrl.launch.memory import (
    MemoryTooSmall,
    check_memory,
    describe,
    estimate_memory,
    model_shape,
    require_memory_fits,
)
from asyncrl.models import build_tiny_policy, count_parameters, load_policy, tiny_spec
from asyncrl.trainer.lora import apply_lora

GIB = 2**30


def _parts(need: memory.DeviceNeed) -> dict[str, int]:
    return {p.name: p.bytes for p in need.parts}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("tiny"), tiny_spec(load_config().sft))


def test_shape_counts_the_real_model(tiny: Path) -> None:
    cfg = load_config()
    model, _ = load_policy(tiny)
    from_dir = model_shape(cfg, tiny)
    from_spec = model_shape(cfg)  # the tiny default, from sft.* alone (no directory)
    assert from_dir is not None and from_dir == from_spec
    assert from_dir.params == count_parameters(model)
    hf = model.config
    assert (from_dir.layers, from_dir.kv_heads, from_dir.vocab) == (
        hf.num_hidden_layers,
        hf.num_key_value_heads,
        hf.vocab_size,
    )
    assert from_dir.head_dim == hf.hidden_size // hf.num_attention_heads


@pytest.mark.parametrize("targets", ["all-linear", "q_proj,v_proj"])
def test_lora_count_equals_peft(tiny: Path, targets: str) -> None:
    cfg = load_config(overrides=["trainer.lora_rank=8", f"trainer.lora_target_modules={targets}"])
    shape = model_shape(cfg, tiny)
    assert shape is not None
    model, _ = load_policy(tiny)
    peft_model = apply_lora(model, cfg.trainer)
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert shape.lora_params(8, targets) == trainable


def test_local_run_parts(tiny: Path) -> None:
    cfg = load_config(overrides=["rollout.max_slots=7", "model.dtype=bfloat16"])
    shape = model_shape(cfg, tiny)
    assert shape is not None
    (need,) = estimate_memory(cfg, shape).devices
    parts = _parts(need)
    seq = cfg.rollout.max_prompt_len + max(cfg.rollout.max_new_tokens, cfg.eval.max_new_tokens)
    # the engine's cache is SlotKVForward's: 2 x layers x (slots + scratch) x kv heads x seq x head_dim
    assert parts["engine KV cache"] == 2 * shape.layers * 8 * shape.kv_heads * seq * shape.head_dim * 2
    assert parts["engine weights"] == parts["trainer parameters"] == shape.params * 2
    assert parts["Adam moments"] == 2 * parts["gradients"] == 2 * shape.params * 2
    assert "LoRA adapters" not in parts and "KL reference" not in parts
    assert need.total == sum(parts.values()) and need.device == "cpu"


def test_lora_and_kl_change_the_trainer_states(tiny: Path) -> None:
    cfg = load_config(overrides=["trainer.lora_rank=4", "algo.kl_coef=0.1"])
    shape = model_shape(cfg, tiny)
    assert shape is not None
    parts = _parts(estimate_memory(cfg, shape).devices[0])
    lora = shape.lora_params(4, "all-linear")
    assert parts["LoRA adapters"] == parts["gradients"] == lora * 4
    assert parts["Adam moments"] == 2 * lora * 4
    assert parts["KL reference"] == parts["trainer parameters"]


def test_ray_places_engines_and_ranks_on_their_gpus(tiny: Path) -> None:
    sets = [
        "launch.kind=ray",
        "launch.trainer_ranks=4",
        "rollout.num_engines=3",
        "launch.gpus_per_engine=1",
        "launch.gpus_per_trainer=1",
    ]
    cfg = load_config(overrides=sets)
    shape = model_shape(cfg, tiny)
    assert shape is not None
    engine, rank = estimate_memory(cfg, shape).devices
    assert (engine.count, rank.count) == (3, 4)
    assert "engine KV cache" in _parts(engine) and "gradients" not in _parts(engine)
    # FSDP2 shards parameters, gradients and moments over the 4 ranks
    assert _parts(rank)["trainer parameters"] == shape.params * 4 // 4
    cpu_only = load_config(overrides=[*sets[:3]])
    (host,) = estimate_memory(cpu_only, shape).devices
    assert host.device == "cpu" and host.total == 3 * engine.total + 4 * rank.total


def test_refusal_names_the_numbers_and_fit_passes(tiny: Path) -> None:
    cfg = load_config(overrides=["model.device=cuda:1"])
    asked: list[str] = []

    def small(device: str) -> tuple[int, str]:
        asked.append(device)
        return 64 * 2**20, "fake device memory"

    with pytest.raises(MemoryTooSmall) as err:
        require_memory_fits(cfg, tiny, available=small)
    text = str(err.value)
    assert asked == ["cuda:1"] and "\n" not in text
    assert "on cuda:1" in text and "64.0 MiB is available (fake device memory)" in text
    assert "engine KV cache" in text
    check = require_memory_fits(cfg, tiny, available=lambda d: (80 * GIB, "fake"))
    assert check is not None and check.failing is None
    assert check_memory(check.estimate, lambda d: None).verdicts[0].fits is None  # unknown: not checked
    assert any("fits in 80.00 GiB" in line for line in describe(check))


def test_unreadable_model_dir_is_not_checked(tmp_path: Path) -> None:
    cfg = load_config()
    assert require_memory_fits(cfg, tmp_path, available=lambda d: (1, "fake")) is None


def test_train_refuses_before_building_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def reached(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run went past the memory check")

    monkeypatch.setattr("asyncrl.launch.local.ensure_policy", reached)
    monkeypatch.setattr(memory, "default_available", lambda device: (2**20, f"fake free memory of {device}"))
    run_dir = tmp_path / "run"
    assert main(["train", "--run-dir", str(run_dir), "--set", "rollout.max_slots=64"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("asyncrl: config error: this run does not fit in memory") and "Traceback" not in err
    assert "1.0 MiB is available (fake free memory of cpu)" in err and len(err.splitlines()) == 1
    assert not run_dir.exists()


def test_kv_formula_matches_the_engine_check() -> None:
    """The estimate's KV cache is the one ``rollout.memory`` checks when the engine allocates it."""
    from asyncrl.rollout.memory import kv_cache_bytes

    cfg = load_config(overrides=["rollout.max_slots=5"])
    shape = model_shape(cfg)
    assert shape is not None
    parts = _parts(estimate_memory(cfg, shape).devices[0])
    seq = cfg.rollout.max_prompt_len + max(cfg.rollout.max_new_tokens, cfg.eval.max_new_tokens)
    assert parts["engine KV cache"] == kv_cache_bytes(
        layers=shape.layers,
        slots=6,
        kv_heads=shape.kv_heads,
        max_seq_len=seq,
        head_dim=shape.head_dim,
        dtype=torch.float32,
    )


def test_engines_elsewhere_are_not_counted(tiny: Path) -> None:
    cfg = load_config(overrides=["launch.engine_urls=http://127.0.0.1:1"])
    shape = model_shape(cfg, tiny)
    assert shape is not None
    estimate = estimate_memory(cfg, shape)
    names = set(_parts(estimate.devices[0]))
    assert "engine weights" not in names and "engine KV cache" not in names and "trainer parameters" in names
    assert any("servers elsewhere" in note for note in estimate.notes)


def test_ray_vllm_engines_shard_over_their_gpus_and_read_the_copy_on_the_host(tiny: Path) -> None:
    import dataclasses

    cfg = load_config(
        overrides=["launch.kind=ray", "rollout.num_engines=2", "launch.gpus_per_engine=2", "launch.gpus_per_trainer=1"]
    )
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, backend="vllm", tensor_parallel_size=2))
    shape = model_shape(cfg, tiny)
    assert shape is not None
    host, engine, rank = estimate_memory(cfg, shape).devices
    assert (host.device, engine.device, engine.count, rank.count) == ("cpu", "cuda", 4, 1)  # 2 engines x 2 shards
    weights = _parts(rank)["trainer parameters"]  # the whole model, one rank
    assert _parts(engine)["engine weights"] == weights // 2 and memory.VLLM_COPY not in _parts(engine)
    assert _parts(host) == {f"{memory.VLLM_COPY} x 2": 2 * weights}
