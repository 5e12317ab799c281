"""``asyncrl bench async | interrupt | ablation``: whole training runs compared side by side.

Owns the controller-level benchmarks of DESIGN §8. Every row is a real ``asyncrl train`` run
(``launch.local.train``, in this process, one after the other, each in its own run directory
under ``--out``) on the same model, data and seed; only the varied parameter changes.

- ``async``: ``controller.max_staleness`` in {0, 1, 2, 4, 8} on two workloads:
  (a) the default task as configured; (b) a generation-heavy long-tailed one: the same
  warm-started policy on longer problems (``task.max_terms=32``, ``task.length_tail=0.85``,
  ``rollout.max_new_tokens=384``), so a few responses are ten times longer than most.
  Metrics: effective throughput ``trained_tokens_per_s`` (tokens of trained sequences per second
  of RL wall time, the paper's measure), held-out ``accuracy_after``, and the ratios to
  max_staleness = 0. For workload (a) also the bottleneck limit: min(trainer alone, engine alone)
  in trained tokens/s, where "trainer alone" is trained tokens per second of training + weight
  sync in the synchronous run (nothing else runs then) and "engine alone" is a calibration of
  the engine at full concurrency with no trainer (completed sequence tokens/s) times the fraction
  of finished groups that were trained in the synchronous run.
- ``interrupt``: at one max_staleness, in-flight weight updates in ``abort`` mode (re-prefill)
  and ``keep`` mode (keep the KV cache) against ``drain`` (stop admitting, wait for running
  episodes to finish, then update).
- ``ablation``: decoupled PPO (``algo.prox_mode=recompute``) against naive PPO
  (``algo.prox_mode=behav``) at max_staleness 4 and 8: held-out accuracy after N steps.

Each prints a table and, with ``--json FILE``, writes ``{"bench", "rows", "ratios", ...}``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

__all__ = ["WORKLOADS", "run_async_bench", "run_interrupt_bench", "run_ablation_bench"]

WORKLOADS: dict[str, list[str]] = {
    "a": [],
    "b": ["task.max_terms=32", "task.length_tail=0.85", "rollout.max_new_tokens=384", "eval.max_new_tokens=384"],
}
"""Config overrides of each workload of ``bench async`` (on top of the user's ``--set``)."""


def _policy_dir(overrides: list[str]) -> str:
    """The warm-started policy of the default task (built once): workload (b) reuses it."""
    from asyncrl.config import load_config
    from asyncrl.controller.warm_start import ensure_policy

    return str(ensure_policy(load_config(None, overrides)))


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _run(overrides: list[str], run_dir: Path) -> dict[str, Any]:
    """One training run; the row of its summary and per-step averages."""
    from asyncrl.config import load_config
    from asyncrl.controller.rundir import read_jsonl
    from asyncrl.launch.local import train

    cfg = load_config(None, [*overrides, f"run.run_dir={run_dir}", "run.progress=false"])
    t0 = time.perf_counter()
    _, summary = train(cfg)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    trained = sum(m["trained_tokens"] for m in metrics)
    busy = sum(m["train_step_s"] + m["weight_sync_s"] for m in metrics)
    finished = summary["trained_samples"] // cfg.rollout.group_size + summary["filtered_groups"]
    finished += summary["stale_groups"]
    return {
        "trained_tokens_per_s": summary["trained_tokens_per_s"],
        "accuracy_before": summary["accuracy_before"],
        "accuracy_after": summary["accuracy_after"],
        "rl_wall_s": summary["rl_wall_s"],
        "wall_s": time.perf_counter() - t0,
        "steps": summary["steps"],
        "trained_tokens": summary["trained_tokens"],
        "trainer_alone_tokens_per_s": trained / busy if busy else 0.0,
        "trained_group_frac": (summary["trained_samples"] // cfg.rollout.group_size) / max(1, finished),
        "staleness_mean": _mean([m["staleness_mean"] for m in metrics]),
        "max_staleness_seen": summary["max_staleness_seen"],
        "stale_groups": summary["stale_groups"],
        "filtered_groups": summary["filtered_groups"],
        "engine_busy_frac": _mean([m["engine_busy_frac"] for m in metrics]),
        "trainer_busy_frac": _mean([m["trainer_busy_frac"] for m in metrics]),
        "generated_tokens_per_s": summary["engine_generated_tokens"] / max(summary["rl_wall_s"], 1e-9),
        "interruptions_per_sample": _mean([m["interruptions_per_sample"] for m in metrics]),
        "response_len": _mean([m["response_len"] for m in metrics]),
        "weight_sync_s": _mean([m["weight_sync_s"] for m in metrics]),
        "run_dir": str(run_dir),
    }


async def _engine_alone(overrides: list[str], seconds: float) -> dict[str, float]:
    """Completed sequence tokens/s of the engine at full concurrency, no trainer (calibration)."""
    from asyncrl.config import load_config
    from asyncrl.controller.scoring import make_score_fn
    from asyncrl.controller.warm_start import ensure_policy
    from asyncrl.data.prompts import PromptSource, build_task
    from asyncrl.models import load_policy, stop_token_ids
    from asyncrl.rollout.engine import LocalEngine
    from asyncrl.rollout.sampling import SamplingParams
    from asyncrl.rollout.workflow import run_episode

    cfg = load_config(None, overrides)
    model, tok = load_policy(ensure_policy(cfg), device=cfg.model.device)
    engine = LocalEngine(model, tok, max_slots=cfg.rollout.max_slots, max_seq_len=cfg.rollout.max_new_tokens + 512)
    train_prompts, _, _ = build_task(cfg.task, tok)
    source = PromptSource(train_prompts, cfg.run.seed)
    score = make_score_fn("arithmetic", tok)
    sampling = SamplingParams(
        max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
        stop_token_ids=stop_token_ids(tok, model),
    )  # fmt: skip
    done_tokens = 0
    start = time.perf_counter()
    deadline = start + seconds

    async def worker() -> None:
        nonlocal done_tokens
        while time.perf_counter() < deadline:
            group = await run_episode(engine, source.next(), sampling, cfg.rollout.group_size, score, 0)
            if time.perf_counter() <= deadline:
                done_tokens += sum(len(c.prompt_ids) + len(c.output_ids) for c in group.completions)

    try:
        await asyncio.gather(*(worker() for _ in range(cfg.controller.max_concurrent)))
    finally:
        engine.close()
    return {"engine_alone_sequence_tokens_per_s": done_tokens / seconds}


def _print_table(title: str, rows: list[dict[str, Any]], keys: list[str]) -> None:
    print(f"\n{title}")
    print("  ".join(f"{k:>22}" for k in keys))
    for row in rows:
        cells = []
        for k in keys:
            v = row.get(k)
            cells.append(f"{v:>22.3f}" if isinstance(v, float) else f"{v!s:>22}")
        print("  ".join(cells))


def _write(json_path: str | None, payload: dict[str, Any]) -> None:
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(payload, indent=2))
        print(f"\nwrote {json_path}")


def run_async_bench(
    json_path: str | None,
    *,
    overrides: list[str] | None = None,
    etas: tuple[int, ...] = (0, 1, 2, 4, 8),
    workloads: tuple[str, ...] = ("a", "b"),
    steps: int | None = None,
    out_dir: str = "runs/bench-async",
    calibrate_s: float = 20.0,
) -> dict[str, Any]:
    """The max_staleness sweep on each workload (see the module docstring)."""
    base = list(overrides or [])
    if steps is not None:
        base.append(f"controller.total_steps={steps}")
    policy = _policy_dir(base)
    rows: list[dict[str, Any]] = []
    ratios: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    for w in workloads:
        wl = [*base, f"model.path={policy}", *WORKLOADS[w]]
        w_rows = []
        for eta in etas:
            print(f"\n=== bench async: workload {w}, max_staleness={eta} ===", flush=True)
            row = {"workload": w, "max_staleness": eta}
            row.update(_run([*wl, f"controller.max_staleness={eta}"], Path(out_dir) / f"{w}-eta{eta}"))
            w_rows.append(row)
        sync = next((r for r in w_rows if r["max_staleness"] == 0), None)
        for row in w_rows:
            if sync:
                row["throughput_ratio_vs_sync"] = row["trained_tokens_per_s"] / max(sync["trained_tokens_per_s"], 1e-9)
                row["accuracy_delta_vs_sync_points"] = 100 * (row["accuracy_after"] - sync["accuracy_after"])
        rows.extend(w_rows)
        ratios[w] = {f"eta{r['max_staleness']}_vs_eta0": r.get("throughput_ratio_vs_sync") for r in w_rows}
        if sync and calibrate_s > 0:
            engine = asyncio.run(_engine_alone(wl, calibrate_s))
            gen_limit = engine["engine_alone_sequence_tokens_per_s"] * sync["trained_group_frac"]
            limit = min(sync["trainer_alone_tokens_per_s"], gen_limit)
            top = max(w_rows, key=lambda r: r["max_staleness"])
            limits[w] = {
                "trainer_alone_tokens_per_s": sync["trainer_alone_tokens_per_s"],
                "engine_alone_trained_tokens_per_s": gen_limit,
                **engine,
                "bottleneck": "trainer" if sync["trainer_alone_tokens_per_s"] <= gen_limit else "engine",
                "bottleneck_limit_tokens_per_s": limit,
                f"eta{top['max_staleness']}_fraction_of_limit": top["trained_tokens_per_s"] / max(limit, 1e-9),
            }
    keys = ["workload", "max_staleness", "trained_tokens_per_s", "throughput_ratio_vs_sync", "accuracy_after",
            "accuracy_delta_vs_sync_points", "staleness_mean", "stale_groups", "engine_busy_frac",
            "trainer_busy_frac", "rl_wall_s"]  # fmt: skip
    _print_table("bench async: effective throughput (trained tokens/s) and held-out accuracy", rows, keys)
    print(json.dumps({"ratios": ratios, "limits": limits}, indent=2))
    payload = {"bench": "async", "overrides": base, "rows": rows, "ratios": ratios, "limits": limits}
    _write(json_path, payload)
    return payload


def run_interrupt_bench(
    json_path: str | None,
    *,
    overrides: list[str] | None = None,
    max_staleness: int = 4,
    workload: str = "b",
    steps: int | None = None,
    out_dir: str = "runs/bench-interrupt",
) -> dict[str, Any]:
    """In-flight updates (abort, keep) against draining the engine before each update."""
    base = list(overrides or [])
    if steps is not None:
        base.append(f"controller.total_steps={steps}")
    wl = [*base, f"model.path={_policy_dir(base)}", *WORKLOADS[workload], f"controller.max_staleness={max_staleness}"]
    modes = {
        "abort": ["controller.weight_sync=inflight", "rollout.interrupt_mode=abort"],
        "keep": ["controller.weight_sync=inflight", "rollout.interrupt_mode=keep"],
        "drain": ["controller.weight_sync=drain"],
    }
    rows = []
    for mode, extra in modes.items():
        print(f"\n=== bench interrupt: {mode} (max_staleness={max_staleness}, workload {workload}) ===", flush=True)
        rows.append({"update_mode": mode, "max_staleness": max_staleness, **_run([*wl, *extra], Path(out_dir) / mode)})
    drain = rows[-1]
    for row in rows:
        row["throughput_ratio_vs_drain"] = row["trained_tokens_per_s"] / max(drain["trained_tokens_per_s"], 1e-9)
    keys = ["update_mode", "trained_tokens_per_s", "throughput_ratio_vs_drain", "generated_tokens_per_s",
            "interruptions_per_sample", "weight_sync_s", "staleness_mean", "accuracy_after"]  # fmt: skip
    _print_table("bench interrupt: in-flight weight updates vs draining", rows, keys)
    ratios = {f"{r['update_mode']}_vs_drain": r["throughput_ratio_vs_drain"] for r in rows}
    payload = {"bench": "interrupt", "overrides": wl, "rows": rows, "ratios": ratios}
    _write(json_path, payload)
    return payload


def run_ablation_bench(
    json_path: str | None,
    *,
    overrides: list[str] | None = None,
    etas: tuple[int, ...] = (4, 8),
    steps: int | None = None,
    out_dir: str = "runs/bench-ablation",
) -> dict[str, Any]:
    """Decoupled PPO (prox recomputed) against naive PPO (behaviour policy as the clip centre)."""
    base = list(overrides or [])
    if steps is not None:
        base.append(f"controller.total_steps={steps}")
    rows = []
    for eta in etas:
        for name, prox in (("decoupled", "recompute"), ("naive", "behav")):
            print(f"\n=== bench ablation: {name} PPO at max_staleness={eta} ===", flush=True)
            run = _run([*base, f"controller.max_staleness={eta}", f"algo.prox_mode={prox}"],
                       Path(out_dir) / f"{name}-eta{eta}")  # fmt: skip
            rows.append({"objective": name, "prox_mode": prox, "max_staleness": eta, **run})
    ratios = {}
    for eta in etas:
        dec, nai = (
            next(r for r in rows if r["max_staleness"] == eta and r["objective"] == o) for o in ("decoupled", "naive")
        )
        ratios[f"eta{eta}_decoupled_minus_naive_points"] = 100 * (dec["accuracy_after"] - nai["accuracy_after"])
    keys = ["objective", "max_staleness", "steps", "accuracy_before", "accuracy_after", "staleness_mean",
            "trained_tokens_per_s"]  # fmt: skip
    _print_table("bench ablation: held-out accuracy after N steps", rows, keys)
    payload = {"bench": "ablation", "overrides": base, "rows": rows, "ratios": ratios}
    _write(json_path, payload)
    return payload
