"""``scripts/device_check.py``: its planning on fake devices (a large and a small GPU, none, the CPU), the
log-prob comparison and the verdict on fakes, and its CPU path's engine and trainer parts on the tiny model.
The whole CPU half runs in ``.ci/run`` (``bash scripts/device_check.sh --cpu``)."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from asyncrl.config import load_config
from tests.repo_paths import SCRIPTS


def _load() -> Any:
    """``scripts/device_check.py`` as the module ``device_check`` (registered first: its dataclasses need it)."""
    spec = importlib.util.spec_from_file_location("device_check", SCRIPTS / "device_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["device_check"] = module
    spec.loader.exec_module(module)
    return module


dc = _load()
GIB = 2**30


def h200(free_gib: float = 139.0) -> Any:
    return dc.DeviceInfo("cuda", "fake H200", int(free_gib * GIB), int(139 * GIB))


def test_no_gpu_says_how_to_run_the_cpu_half() -> None:
    with pytest.raises(SystemExit, match="device_check.sh --cpu"):
        dc.plan_check(None, "")


def test_a_large_gpu_gets_the_1b_model_in_bf16() -> None:
    plan = dc.plan_check(h200(), "", budget_s=450)
    assert (plan.scale, plan.device, plan.dtype) == ("gpu", "cuda", "bfloat16")
    assert plan.spec == dc.GPU_SPEC and 0.9e9 < plan.params < 1.1e9 and not plan.notes
    assert plan.memory_gib <= dc.GPU_SHARE * 139
    assert plan.batch_sizes[0] == 1 and plan.batch_sizes[-1] <= 256 and plan.etas == (0, 4)
    # the eta runs' RL time is what the budget leaves after the fixed parts and each run's overhead
    assert plan.train_seconds == (450 - dc.FIXED_S - 2 * dc.RUN_OVERHEAD_S) / 2 and plan.vllm_skip == ""
    assert dc.plan_check(h200(), "", budget_s=100).train_seconds == 30  # never below half a minute
    # the eta runs' overrides are a valid config on that device, with the staleness the check adds
    cfg = load_config(None, [*plan.train_overrides, "controller.max_staleness=4"])
    assert cfg.model.device == "cuda" and cfg.model.dtype == "bfloat16"
    assert cfg.controller.max_rl_time_s == plan.train_seconds
    assert not cfg.algo.filter_equal_rewards  # a random policy's all-zero groups still train
    # the engines hold every sample of the log-prob check and the largest decode batch
    assert plan.max_seq_len >= 64 + plan.new_tokens and plan.kv_cache_gib >= 1.0


def test_a_small_gpu_gets_a_shallower_model_that_fits() -> None:
    plan = dc.plan_check(h200(free_gib=16), "vllm is not importable")
    assert plan.spec["num_layers"] < dc.GPU_SPEC["num_layers"] and plan.notes
    assert plan.memory_gib <= dc.GPU_SHARE * 16
    assert plan.spec["hidden_size"] == dc.GPU_SPEC["hidden_size"]  # the width (per-step weight reads) kept
    assert plan.vllm_skip == "vllm is not importable"
    with pytest.raises(SystemExit, match="even one layer"):
        dc.plan_check(h200(free_gib=0.5), "")


def test_the_cpu_plan_is_tiny_and_fp32() -> None:
    plan = dc.plan_check(dc.DeviceInfo("cpu", "x86_64", 8 * GIB, 8 * GIB), "no vllm here")
    assert (plan.device, plan.dtype, plan.max_abs_tol) == ("cpu", "float32", 1e-4)
    assert plan.params < 1_000_000 and plan.train_steps == 2 and plan.vllm_skip == "no vllm here"
    load_config(None, list(plan.train_overrides))


def _pair(prompt: list[int], out: list[int], behav: list[float]) -> tuple[list[int], Any]:
    return prompt, SimpleNamespace(output_ids=tuple(out), behav_logprobs=tuple(behav))


class FakeTrainer:
    """Recomputes each sample as the engine's log-probs plus a fixed offset on the output tokens."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def compute_logprobs(self, samples: list[Any]) -> list[torch.Tensor]:
        out = []
        for s in samples:
            lp = [b + self.offset if m else 0.0 for b, m in zip(s.behav_logprobs, s.loss_mask, strict=True)]
            out.append(torch.tensor(lp, dtype=torch.float64))
        return out


@pytest.mark.parametrize(("offset", "ok"), [(5e-6, True), (5e-4, False)])
def test_compare_measures_the_output_tokens_only(offset: float, ok: bool) -> None:
    plan = dc.plan_check(dc.DeviceInfo("cpu", "x", GIB, GIB), "")
    pairs = [_pair([2, 5, 6], [7, 8], [-1.0, -2.0]), _pair([2, 9], [10, 11, 12], [-0.5, -0.25, -3.0])]
    numbers = dc.compare(plan, FakeTrainer(offset), pairs)
    assert numbers["tokens"] == 5 and numbers["samples"] == 2
    assert numbers["max_abs_diff"] == pytest.approx(offset, rel=1e-3)
    assert numbers["ok"] is ok


def test_the_verdict_needs_every_check() -> None:
    good = {
        "logprobs_vs_trainer": {"local": {"ok": True}, "vllm": {"skipped": "absent"}},
        "train": {"eta0": {"ledger_ok": True}, "eta4": {"ledger_ok": True}},
    }
    assert dc.passed(good)
    assert not dc.passed({**good, "train": {"eta0": {"ledger_ok": False}}})
    assert not dc.passed({**good, "logprobs_vs_trainer": {"local": {"ok": False}}})
    assert not dc.passed({**good, "logprobs_vs_trainer": {"vllm": {"skipped": "absent"}}})  # nothing checked


def test_the_cpu_path_engine_and_trainer_parts(tmp_path: Path) -> None:
    """The script's own functions on the tiny model: the local engine's samples against the trainer (fp32:
    invariant 4's bound) and a decode sweep."""
    plan = dc.plan_check(dc.DeviceInfo("cpu", "x", 8 * GIB, 8 * GIB), "skipped here")
    plan = dataclasses.replace(plan, batch_sizes=(1, 2), decode_tokens=6, prompts=2, new_tokens=8)
    model_dir = dc.build_model(plan, tmp_path / "model")
    from asyncrl.models import load_tokenizer

    ids = dc.prompts(load_tokenizer(model_dir), plan.prompts)
    loop = asyncio.new_event_loop()
    try:
        phase = dc.engine_phase(plan, "local", model_dir, ids, loop.run_until_complete)
    finally:
        loop.close()
    assert [r["batch"] for r in phase["batches"]] == [1, 2]
    assert [r["tokens"] for r in phase["batches"]] == [6, 12]  # no stop token: every sample runs its budget
    numbers = dc.trainer_phase(plan, model_dir, {"local": phase})["local"]
    assert numbers["tokens"] == plan.prompts * plan.group * plan.new_tokens
    assert numbers["ok"] and numbers["max_abs_diff"] <= 1e-4
