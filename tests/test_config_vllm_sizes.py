"""``rollout.tensor_parallel_size`` and ``rollout.gpu_memory_fraction``: range-checked, refused off the vLLM
backend in one line, and handed by ``launch.stages.build_engine`` to ``VLLMEngine`` (faked at the seam: vLLM is
not installed in ``make test``'s environment)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from asyncrl.config import ConfigError, load_config


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rollout.tensor_parallel_size=2"], "rollout.tensor_parallel_size sizes vLLM engines"),
        (["rollout.gpu_memory_fraction=0.5"], "rollout.gpu_memory_fraction sizes vLLM engines"),
        (["rollout.gpu_memory_fraction=1.5"], "must be in (0, 1]"),
        (["rollout.gpu_memory_fraction=0"], "rollout.gpu_memory_fraction"),
        (["rollout.tensor_parallel_size=0"], "rollout.tensor_parallel_size"),
    ],
)
def test_bad_sizes_are_refused_in_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_defaults_pass_on_the_local_backend() -> None:
    cfg = load_config(None, [])
    assert cfg.rollout.tensor_parallel_size == 1 and cfg.rollout.gpu_memory_fraction is None


def test_build_engine_hands_both_to_the_vllm_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncrl.rollout.vllm_engine as vllm_engine
    from asyncrl.launch.stages import build_engine

    seen: dict[str, Any] = {}

    class FakeVLLMEngine:
        def __init__(self, model_dir: Path, **kwargs: Any) -> None:
            seen.update(kwargs, model_dir=Path(model_dir))

    class Saves:
        def save_pretrained(self, path: str, **_: Any) -> None:
            (Path(path) / "saved").write_text("x")

    monkeypatch.setattr(vllm_engine, "VLLMEngine", FakeVLLMEngine)
    cfg = load_config(None, [])
    rollout = dataclasses.replace(cfg.rollout, backend="vllm", tensor_parallel_size=4, gpu_memory_fraction=0.45)
    cfg = dataclasses.replace(cfg, rollout=rollout)
    build_engine(cfg, Saves(), Saves())
    assert seen["tensor_parallel_size"] == 4 and seen["gpu_memory_fraction"] == 0.45
    assert (seen["model_dir"] / "saved").is_file() and seen["owns_model_dir"] is True
