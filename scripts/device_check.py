"""The GPU path in one check: a local Llama-architecture model big enough for decode to be memory-bound, the
project's engine and the vLLM backend on it, their behaviour log-probs against the trainer's recomputation,
decode tokens/s against batch size, and eta = 0 and eta = 4 training runs; one JSON result.

Run through ``scripts/device_check.sh`` (it picks ``.venv-vllm`` when that environment exists)::

    bash scripts/device_check.sh                 # one GPU: ~1B parameters in bf16, under 8 minutes
    bash scripts/device_check.sh --cpu           # the same code path at tiny scale in fp32 (CI: about a minute)

Nothing is downloaded: the model is a random-init Llama decoder (``models.build_tiny_policy`` at the chosen
shape) with the project's own character-level tokenizer. ``plan_check`` turns the device (a CUDA device's name
and free memory, or the CPU) and whether vLLM imports into a ``CheckPlan``: the shape, dtype, batch sizes and
budgets, the GPU model shrunk until the training run's memory estimate (``launch.memory``) fits. Each part
records a skip reason instead of numbers where it cannot run (vLLM absent from the running environment). The
result goes through ``asyncrl.results.write_text_result`` (never over an existing file). Exit code 1 when a
log-prob check fails or a training run's ledger check does not pass.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = {"gpu": "docs/results/device_check_gpu.json", "cpu": "docs/results/device_check_cpu.json"}
GPU_SPEC = {
    "hidden_size": 2048,
    "num_layers": 16,
    "num_heads": 32,
    "num_kv_heads": 8,
    "intermediate_size": 8192,
    "max_position_embeddings": 2048,
}
"""~0.97 B parameters (vocabulary 100): 1.9 GB of bf16 weights read per decode step."""
CPU_SPEC = {
    "hidden_size": 128,
    "num_layers": 4,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 384,
    "max_position_embeddings": 1024,
}
"""The tiny default's shape (0.8 M parameters)."""
FIXED_S = 210.0
"""GPU: seconds estimated for the build, both engines (vLLM's start included) and the trainer's recomputation."""
RUN_OVERHEAD_S = 60.0
"""GPU: seconds estimated for a training run's start, evaluations and final checkpoint, beside its RL time."""
GPU_SHARE = 0.5
"""Most of a GPU's free memory the eta runs' estimate may take (activations and the allocator's slack are not
in it)."""


@dataclass(frozen=True)
class DeviceInfo:
    """What the plan reads of the device."""

    kind: str
    """``cuda`` or ``cpu``."""
    name: str
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class CheckPlan:
    """Everything the check does, decided before it starts."""

    scale: str
    """``gpu`` or ``cpu``."""
    device: str
    dtype: str
    spec: dict[str, int]
    params: int
    prompts: int
    group: int
    new_tokens: int
    max_abs_tol: float
    """Largest allowed |engine - trainer| log-prob (fp32: invariant 4's 1e-4; bf16: two roundings apart)."""
    mean_abs_tol: float
    batch_sizes: tuple[int, ...]
    decode_tokens: int
    max_seq_len: int
    train_seconds: float
    train_steps: int
    train_overrides: tuple[str, ...]
    etas: tuple[int, ...] = (0, 4)
    vllm_skip: str = ""
    """Why the vLLM part does not run (empty: it runs)."""
    kv_cache_gib: float = 1.0
    memory_gib: float = 0.0
    """The eta runs' memory estimate on the device (``launch.memory``)."""
    notes: tuple[str, ...] = field(default_factory=tuple)


def probe_device(cpu: bool) -> DeviceInfo | None:
    """The CUDA device this process sees (None: none), or the CPU when ``cpu``."""
    import torch

    from asyncrl.rollout.memory import available_bytes

    if cpu:
        found = available_bytes("cpu")
        free = found[0] if found else 0
        return DeviceInfo("cpu", platform.processor() or platform.machine(), free, free)
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(0)
    return DeviceInfo("cuda", torch.cuda.get_device_name(0), int(free), int(total))


def vllm_skip_reason() -> str:
    """Empty when vLLM imports here; else why its part is skipped."""
    from asyncrl.rollout.vllm_engine import vllm_available

    if vllm_available():
        return ""
    return f"vllm is not importable in {sys.prefix} (make vllm-env, then run with .venv-vllm/bin/python)"


def _train_overrides(scale: str, device: str, dtype: str, train_seconds: float, steps: int) -> tuple[str, ...]:
    common = [
        "controller.eval_every=0",
        "eval.report_greedy=false",
        "eval.samples_per_prompt=1",
        "run.progress=false",
        "algo.filter_equal_rewards=false",
        "controller.checkpoint_every=0",
        f"model.device={device}",
        f"model.dtype={dtype}",
        f"controller.total_steps={steps}",
        f"controller.max_rl_time_s={train_seconds}",
    ]
    if scale == "gpu":  # a random policy scores 0: the groups are kept (zero advantages) so that steps happen
        return (
            *common,
            "controller.batch_size=16",
            "rollout.group_size=8",
            "rollout.max_new_tokens=256",
            "rollout.max_slots=256",
            "rollout.max_prompt_len=64",
            "eval.max_new_tokens=64",
            "task.eval_size=32",
            "trainer.max_tokens_per_micro_batch=8192",
        )
    return (
        *common,
        "controller.batch_size=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=16",
        "rollout.max_slots=8",
        "rollout.max_prompt_len=64",
        "eval.max_new_tokens=16",
        "task.eval_size=4",
        "task.train_size=64",
    )


def _training_estimate(spec: dict[str, int], overrides: tuple[str, ...]) -> tuple[int, int]:
    """(parameters, bytes the eta runs need on their device) of a model of ``spec``: ``launch.memory``."""
    from transformers import LlamaConfig

    from asyncrl.config import load_config
    from asyncrl.launch.memory import estimate_memory, shape_of_hf_config

    shape = shape_of_hf_config(
        LlamaConfig(
            vocab_size=100,
            hidden_size=spec["hidden_size"],
            intermediate_size=spec["intermediate_size"],
            num_hidden_layers=spec["num_layers"],
            num_attention_heads=spec["num_heads"],
            num_key_value_heads=spec["num_kv_heads"],
            max_position_embeddings=spec["max_position_embeddings"],
            tie_word_embeddings=True,
        )
    )
    cfg = load_config(None, [o for o in overrides if not o.startswith("model.device")])
    return shape.params, estimate_memory(cfg, shape).devices[0].total


def plan_check(device: DeviceInfo | None, vllm_skip: str, *, budget_s: float = 450.0) -> CheckPlan:
    """The check for ``device`` (``SystemExit`` with the command to use when there is none): on a GPU a ~1B
    model in bf16, halved in depth until the eta runs' estimate (``launch.memory``) takes at most
    ``GPU_SHARE`` of the free memory; on the CPU the tiny shape in fp32 at the smallest sizes. The engines and
    the trainer take turns on the device (vLLM asks for 90% of it at start), so only the eta runs share it."""
    if device is None:
        raise SystemExit(
            "device_check: no CUDA device is visible here; run `bash scripts/device_check.sh --cpu` "
            "for the CPU half, or this script on a GPU machine"
        )
    if device.kind == "cpu":
        overrides = _train_overrides("cpu", "cpu", "float32", 0.0, 2)
        params, need = _training_estimate(CPU_SPEC, overrides)
        return CheckPlan(
            scale="cpu",
            device="cpu",
            dtype="float32",
            spec=dict(CPU_SPEC),
            params=params,
            prompts=4,
            group=2,
            new_tokens=24,
            max_abs_tol=1e-4,
            mean_abs_tol=1e-5,
            batch_sizes=(1, 4, 16),
            decode_tokens=32,
            max_seq_len=256,
            train_seconds=0.0,
            train_steps=2,
            train_overrides=overrides,
            vllm_skip=vllm_skip,
            kv_cache_gib=0.25,
            memory_gib=round(need / 2**30, 3),
        )
    spec = dict(GPU_SPEC)
    train_s = max(30.0, round((budget_s - FIXED_S - 2 * RUN_OVERHEAD_S) / 2))  # two eta runs
    overrides = _train_overrides("gpu", "cuda", "bfloat16", train_s, 10_000)
    params, need = _training_estimate(spec, overrides)
    notes = []
    while need > GPU_SHARE * device.free_bytes and spec["num_layers"] > 1:
        spec["num_layers"] //= 2
        params, need = _training_estimate(spec, overrides)
        notes.append(
            f"{spec['num_layers']} layers: the eta runs' estimate must fit in {GPU_SHARE:.0%} of "
            f"{device.name}'s free memory"
        )
    if need > GPU_SHARE * device.free_bytes:
        raise SystemExit(
            f"device_check: {device.name} has {device.free_bytes / 2**30:.1f} GiB free; even one layer "
            f"needs {need / 2**30:.1f} GiB for the training runs"
        )
    kv_gib = max(1.0, min(16.0, device.free_bytes / 2**30 / 8))
    return CheckPlan(
        scale="gpu",
        device="cuda",
        dtype="bfloat16",
        spec=spec,
        params=params,
        prompts=8,
        group=4,
        new_tokens=128,
        max_abs_tol=0.5,
        mean_abs_tol=0.02,
        batch_sizes=(1, 4, 16, 64, 256),
        decode_tokens=128,
        max_seq_len=512,
        train_seconds=train_s,
        train_steps=10_000,
        train_overrides=overrides,
        vllm_skip=vllm_skip,
        kv_cache_gib=round(kv_gib, 1),
        memory_gib=round(need / 2**30, 2),
        notes=tuple(notes),
    )


# ------------------------------------------------------------------------------------------ the parts
def build_model(plan: CheckPlan, out_dir: Path) -> Path:
    """The random-init Llama decoder of ``plan.spec`` with the project's tokenizer, saved in ``out_dir``."""
    from asyncrl.models import TinyModelSpec, build_tiny_policy

    return build_tiny_policy(out_dir, TinyModelSpec(**plan.spec, seed=0))


def prompts(tokenizer: Any, n: int) -> list[list[int]]:
    """``n`` arithmetic questions in the tiny chat format, as ids."""
    return [list(tokenizer.encode(f"Q:{17 * i + 3}+{29 * i + 8}\nA:", add_special_tokens=False)) for i in range(n)]


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


async def sample(plan: CheckPlan, engine: Any, ids: list[list[int]]) -> list[tuple[list[int], Any]]:
    """``plan.group`` samples at T = 1 of each prompt: (prompt, ``Completion``) pairs."""
    from asyncrl.rollout.sampling import SamplingParams

    sp = SamplingParams(max_new_tokens=plan.new_tokens, temperature=1.0, seed=7)
    groups = await asyncio.gather(*(engine.generate(p, sp, plan.group) for p in ids))
    return [(p, c) for p, g in zip(ids, groups, strict=True) for c in g]


def compare(plan: CheckPlan, trainer: Any, pairs: list[tuple[list[int], Any]]) -> dict[str, Any]:
    """The engine's behaviour log-probs of ``pairs`` against ``trainer.compute_logprobs`` on the same tokens
    (what the trainer recomputes as the proximal policy), within the plan's tolerances or not."""
    from asyncrl.types import TrainSample

    samples = []
    for i, (p, c) in enumerate(pairs):
        n, k = len(p), len(c.output_ids)
        samples.append(
            TrainSample(
                prompt_id=str(i),
                sample_idx=0,
                token_ids=tuple(p) + tuple(c.output_ids),
                loss_mask=(0,) * n + (1,) * k,
                behav_logprobs=(0.0,) * n + tuple(c.behav_logprobs),
                advantages=(0.0,) * (n + k),
                versions=(-1,) * n + (0,) * k,
                min_version=0,
                max_version=0,
            )
        )
    recomputed = trainer.compute_logprobs(samples)
    diffs = [
        abs(float(lp[len(p) + t]) - b)
        for (p, c), lp in zip(pairs, recomputed, strict=True)
        for t, b in enumerate(c.behav_logprobs)
    ]
    worst, mean = max(diffs), sum(diffs) / len(diffs)
    return {
        "samples": len(pairs),
        "tokens": len(diffs),
        "max_abs_diff": worst,
        "mean_abs_diff": mean,
        "max_abs_tol": plan.max_abs_tol,
        "mean_abs_tol": plan.mean_abs_tol,
        "ok": worst <= plan.max_abs_tol and mean <= plan.mean_abs_tol,
    }


async def decode_sweep(plan: CheckPlan, engine: Any, prompt: list[int]) -> list[dict[str, Any]]:
    """Tokens/s of ``b`` concurrent samples of ``plan.decode_tokens`` tokens each, for each batch size ``b``
    (no stop token: every sample runs its whole budget); a warm-up first."""
    from asyncrl.rollout.sampling import SamplingParams

    await engine.generate(prompt, SamplingParams(max_new_tokens=8, seed=1), 1)
    rows = []
    for b in plan.batch_sizes:
        sp = [SamplingParams(max_new_tokens=plan.decode_tokens, seed=100 + i) for i in range(b)]
        _sync(plan.device)
        t0 = time.perf_counter()
        done = await asyncio.gather(*(engine.generate(prompt, s, 1) for s in sp))
        _sync(plan.device)
        wall = time.perf_counter() - t0
        tokens = sum(len(c.output_ids) for g in done for c in g)
        rows.append(
            {
                "batch": b,
                "tokens": tokens,
                "wall_s": round(wall, 3),
                "tokens_per_s": round(tokens / wall, 1),
                "ms_per_step": round(1000 * wall / plan.decode_tokens, 2),
            }
        )
        print(f"  batch {b:4d}: {tokens / wall:10.1f} tokens/s ({1000 * wall / plan.decode_tokens:.2f} ms/step)")
    return rows


def _free(device: str) -> None:
    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def _engine(plan: CheckPlan, which: str, model_dir: Path) -> Any:
    slots = max(*plan.batch_sizes, plan.prompts * plan.group)
    if which == "vllm":
        from asyncrl.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(
            model_dir, max_slots=slots, max_seq_len=plan.max_seq_len, dtype=plan.dtype, kv_cache_gib=plan.kv_cache_gib
        )
    from asyncrl.models import load_policy
    from asyncrl.rollout.engine import LocalEngine

    model, tok = load_policy(model_dir, device=plan.device, dtype=plan.dtype)  # type: ignore[arg-type]
    return LocalEngine(model, tok, max_slots=slots, max_seq_len=plan.max_seq_len, device=plan.device)


def engine_phase(plan: CheckPlan, which: str, model_dir: Path, ids: list[list[int]], run: Any) -> dict[str, Any]:
    """Load the ``which`` engine (``local`` or ``vllm``) alone on the device, sample for the log-prob check,
    sweep decode over the batch sizes, close it and free its memory."""
    print(f"\n== {which} engine", flush=True)
    t0 = time.perf_counter()
    engine = _engine(plan, which, model_dir)
    try:
        load_s = time.perf_counter() - t0
        pairs = run(sample(plan, engine, ids))
        rows = run(decode_sweep(plan, engine, ids[0]))
    finally:
        engine.close()
        del engine
        _free(plan.device)
    weight_bytes = plan.params * (2 if plan.dtype != "float32" else 4)
    for row in rows:  # the weights are read once per decode step: the bandwidth that reading implies
        row["weights_read_GB_per_s"] = round(weight_bytes / (row["ms_per_step"] / 1000) / 1e9, 1)
    return {"load_s": round(load_s, 1), "pairs": pairs, "batches": rows}


def trainer_phase(plan: CheckPlan, model_dir: Path, phases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The project's trainer on the device recomputes every engine's samples (``compare``)."""
    from asyncrl.config import load_config
    from asyncrl.models import load_policy
    from asyncrl.trainer.trainer import Trainer

    print("\n== trainer recomputation", flush=True)
    cfg = load_config(None, [f"model.device={plan.device}", f"model.dtype={plan.dtype}"])
    model, _ = load_policy(model_dir, device=plan.device, dtype=plan.dtype)  # type: ignore[arg-type]
    trainer = Trainer(model, cfg.trainer, cfg.algo, temperature=1.0, device=plan.device)
    try:
        out = {which: compare(plan, trainer, phase.pop("pairs")) for which, phase in phases.items()}
    finally:
        del trainer, model
        _free(plan.device)
    for which, numbers in out.items():
        print(
            f"  {which}: max |diff| {numbers['max_abs_diff']:.3g}, mean {numbers['mean_abs_diff']:.3g} over "
            f"{numbers['tokens']} tokens ({'ok' if numbers['ok'] else 'OUT OF TOLERANCE'})"
        )
    return out


def train_run(plan: CheckPlan, model_dir: Path, eta: int, work: Path) -> dict[str, Any]:
    """``asyncrl train`` (the local launcher, the project's engine) at ``max_staleness = eta`` on the device,
    then the ledger check (invariant 7)."""
    from asyncrl.config import load_config
    from asyncrl.controller.ledger_checks import check_ledger
    from asyncrl.launch.local import train

    print(f"\n== training at eta = {eta}", flush=True)
    run_dir = work / f"eta{eta}"
    sets = [
        *plan.train_overrides,
        f"controller.max_staleness={eta}",
        "run.seed=0",
        f"model.path={model_dir}",
        f"run.run_dir={run_dir}",
    ]
    t0 = time.perf_counter()
    _, summary = train(load_config(None, sets))
    wall = time.perf_counter() - t0
    report = check_ledger(run_dir)
    keys = (
        "steps",
        "trained_samples",
        "trained_tokens",
        "trained_tokens_per_s",
        "rl_wall_s",
        "max_staleness_seen",
        "engine_generated_tokens",
        "generation_during_training_frac",
        "stale_groups",
        "ended_by",
    )
    _free(plan.device)
    return {
        "overrides": sets[:-2],
        "wall_s": round(wall, 1),
        **{k: summary.get(k) for k in keys},
        "ledger_ok": report.ok,
        "admitted": report.admitted,
        "lost": len(report.lost),
        "trained_twice": len(report.trained_twice),
        "over_bound": len(report.over_bound),
    }


def run_check(plan: CheckPlan, work: Path) -> dict[str, Any]:
    """Every part in turn; the result's numbers (``plan`` and the environment are added by ``main``)."""
    from asyncrl.models import load_tokenizer

    t0 = time.perf_counter()
    model_dir = build_model(plan, work / "model")
    result: dict[str, Any] = {"build_s": round(time.perf_counter() - t0, 1)}
    ids = prompts(load_tokenizer(model_dir), plan.prompts)
    loop = asyncio.new_event_loop()  # one loop: a vLLM engine is bound to the loop of its first call
    try:
        phases = {"local": engine_phase(plan, "local", model_dir, ids, loop.run_until_complete)}
        if not plan.vllm_skip:
            phases["vllm"] = engine_phase(plan, "vllm", model_dir, ids, loop.run_until_complete)
    finally:
        loop.close()
    result["logprobs_vs_trainer"] = trainer_phase(plan, model_dir, phases)
    result["decode"] = {which: phase for which, phase in phases.items()}
    if plan.vllm_skip:
        result["logprobs_vs_trainer"]["vllm"] = result["decode"]["vllm"] = {"skipped": plan.vllm_skip}
    result["train"] = {f"eta{eta}": train_run(plan, model_dir, eta, work) for eta in plan.etas}
    return result


def passed(result: dict[str, Any]) -> bool:
    """Every log-prob check that ran within tolerance and every training run's ledger check passed."""
    checks = [v["ok"] for v in result["logprobs_vs_trainer"].values() if "ok" in v]
    return all(checks) and bool(checks) and all(r["ledger_ok"] for r in result["train"].values())


def environment(device: DeviceInfo) -> dict[str, Any]:
    import torch

    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "device": dataclasses.asdict(device),
        "cuda": torch.version.cuda,
    }
    try:
        import vllm

        env["vllm"] = vllm.__version__
    except ImportError:
        env["vllm"] = None
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="the CPU half: tiny model, fp32 (what CI runs)")
    ap.add_argument("--out", help="result JSON (default docs/results/device_check_{gpu,cpu}.json; never replaced)")
    ap.add_argument("--budget-s", type=float, default=450.0, help="GPU: wall-clock budget the eta runs are sized to")
    args = ap.parse_args(argv)
    from asyncrl.results import check_result_path, write_text_result

    out = Path(args.out or ROOT / DEFAULT_OUT["cpu" if args.cpu else "gpu"])
    check_result_path(out)
    t0 = time.perf_counter()
    device = probe_device(args.cpu)
    plan = plan_check(device, vllm_skip_reason(), budget_s=args.budget_s)
    assert device is not None
    print(
        f"device check on {device.kind} ({device.name}): {plan.params:,} parameters in {plan.dtype}, batch sizes "
        f"{list(plan.batch_sizes)}, eta {list(plan.etas)}; vLLM: {plan.vllm_skip or 'on'}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="asyncrl-device-check-") as work:
        result = run_check(plan, Path(work))
    result.update(
        plan=dataclasses.asdict(plan),
        environment=environment(device),
        passed=passed(result),
        wall_s=round(time.perf_counter() - t0, 1),
        command="bash scripts/device_check.sh" + (" --cpu" if args.cpu else ""),
    )
    written = write_text_result(out, json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"\ndevice check {'passed' if result['passed'] else 'FAILED'} in {result['wall_s']:.0f} s: {written}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
