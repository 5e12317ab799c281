"""A simulated run's figures (``SimResult``) and its run directory.

Owns ``summarise`` (the recorder's raw output into the figures a user compares: throughput by the
definition of ``controller.throughput`` — steady-state and whole run —, staleness, engine and trainer
utilisation) and ``write_run_dir`` (``metrics.jsonl``, ``timeline.jsonl``, the ledger when kept,
``summary.json`` and a ``config.yaml`` carrying the settings ``asyncrl report`` reads), so that
``asyncrl report`` plots a simulated run exactly as it plots a real one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from asyncrl.controller.adaptive import setting_means
from asyncrl.controller.throughput import FINISHED, measure_throughput
from asyncrl.sim.scenario import Scenario


@dataclass(frozen=True)
class SimResult:
    """The figures of one simulated run (times in simulated seconds unless named ``wall``)."""

    profile: str
    steps: int
    sim_time_s: float
    """Simulated RL time at the end of the last training step (publication included)."""
    steady_state_tokens_per_s: float
    """Effective throughput in the window after warm-up (``controller.throughput``'s definition)."""
    whole_run_tokens_per_s: float
    """Trained tokens over the whole simulated run."""
    window_start_s: float
    trained_tokens: int
    generated_tokens: float
    staleness_hist: dict[int, int]
    """Trained groups by staleness (``trained step - oldest token version``)."""
    staleness_mean: float
    max_staleness_seen: int
    engine_busy_frac: float
    """Engine time decoding, prefilling or loading weights, over engines x run time."""
    engine_decode_frac: float
    mean_engine_running: float
    """Sequences running, all engines together, averaged over the run (an exact integral; the
    timeline's samples give ``controller.time_budget``'s estimate of the same)."""
    engine_occupancy: float
    """``mean_engine_running`` over all slots of all engines."""
    slot_utilisation: float
    """Tokens of decode steps over slots x decode steps (``LocalEngine.stats``'s measure)."""
    trainer_busy_frac: float
    """Time in training steps and weight sync over run time."""
    interruptions_per_sample: float
    prefill_tokens: float
    groups: dict[str, int]
    """Admitted groups by fate: trained, filtered, stale, unused, in_flight."""
    engines: int
    trainer_ranks: int
    slots: int
    wall_s: float
    """Real seconds the simulation took."""
    cpu_s: float
    """CPU seconds of this process during the simulation (what a busy machine does not inflate)."""
    events: int
    events_per_s: float
    eta_mean: float = 0.0
    """η in force, averaged over the steps (``max_staleness``, or adaptive admission's η_t after each step)."""
    high_water_mean: float = 0.0
    """The mark in batches in force, averaged over the steps (adaptive admission's, or the scenario's)."""

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


def warmup_s(raw: dict[str, Any], scenario: Scenario) -> float:
    """When the steady-state window opens: the end of step ``warmup_steps`` (default a tenth)."""
    metrics = raw["metrics"]
    k = scenario.warmup_steps if scenario.warmup_steps >= 0 else len(metrics) // 10
    return float(metrics[k - 1]["time_s"]) if 0 < k < len(metrics) else 0.0


def summarise(raw: dict[str, Any], scenario: Scenario, profile: str) -> SimResult:
    """The figures of a finished simulation (``Simulator.run()``'s output)."""
    metrics, timeline = raw["metrics"], raw["timeline"]
    finished = [{"status": k, "response_len": v} for k, v in raw["finished_tokens"].items() if k in FINISHED]
    window = warmup_s(raw, scenario)
    thr = measure_throughput(metrics, finished, timeline, warmup_s=window)
    end = raw["end_s"]
    eng = raw["engine"]
    hist = {int(k): v for k, v in sorted(raw["staleness"].items())}
    trained_groups = sum(hist.values())
    groups = {k: raw["statuses"].get(k, 0) for k in ("trained", "filtered", "stale", "unused", "in_flight")}
    groups["admitted"] = raw["admitted"]
    slots = scenario.slots * scenario.engines
    return SimResult(
        profile=profile,
        steps=len(metrics),
        sim_time_s=end,
        steady_state_tokens_per_s=thr.steady_state_tokens_per_s,
        whole_run_tokens_per_s=thr.whole_run_tokens_per_s,
        window_start_s=window,
        trained_tokens=raw["trained_tokens"],
        generated_tokens=eng["generated_tokens"],
        staleness_hist=hist,
        staleness_mean=sum(k * v for k, v in hist.items()) / max(1, trained_groups),
        max_staleness_seen=max(hist) if hist else 0,
        engine_busy_frac=eng["busy_s"] / (end * scenario.engines) if end > 0 else 0.0,
        engine_decode_frac=eng["decode_s"] / (end * scenario.engines) if end > 0 else 0.0,
        mean_engine_running=raw["running_s"] / end if end > 0 else 0.0,
        engine_occupancy=raw["running_s"] / (end * slots) if end > 0 else 0.0,
        slot_utilisation=eng["decode_tokens"] / (scenario.slots * eng["decode_steps"]) if eng["decode_steps"] else 0.0,
        trainer_busy_frac=(raw["train_busy_s"] + raw["sync_busy_s"]) / end if end > 0 else 0.0,
        interruptions_per_sample=raw["interrupts"] / max(1, raw["trained_samples"]),
        prefill_tokens=eng["prefill_tokens"],
        groups=groups,
        engines=scenario.engines,
        trainer_ranks=scenario.trainer_ranks,
        slots=scenario.slots,
        wall_s=raw["wall_s"],
        cpu_s=raw.get("cpu_s", 0.0),
        events=raw["events"],
        events_per_s=raw["events"] / max(raw["wall_s"], 1e-9),
        **setting_means(metrics, scenario.max_staleness, scenario.high_water_batches),
    )


def _config_view(scenario: Scenario) -> dict[str, Any]:
    """The config keys ``asyncrl report`` reads, then the whole scenario under ``sim``."""
    s = scenario
    return {
        "controller": {
            "batch_size": s.batch_size,
            "max_staleness": s.max_staleness,
            "max_concurrent": s.max_concurrent,
            "high_water_batches": s.high_water_batches,
            "high_water_unit": s.high_water_unit,
            "total_steps": s.total_steps,
            "weight_sync": s.weight_sync,
        },
        "rollout": {
            "group_size": s.group_size,
            "max_slots": s.slots,
            "interrupt_mode": s.interrupt_mode,
            "num_engines": s.engines,
            "max_new_tokens": s.max_new_tokens,
        },
        "task": {"verifier": "simulated"},
        "algo": {"filter_equal_rewards": s.filter_prob > 0},
        "sim": s.to_dict(),
    }


def write_run_dir(path: str | Path, raw: dict[str, Any], scenario: Scenario, result: SimResult) -> Path:
    """A run directory ``asyncrl report`` reads (the ledger only when the run kept it)."""
    import yaml

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    run_id = f"sim-{out.name}"

    def jsonl(name: str, rows: list[dict[str, Any]]) -> None:
        with (out / name).open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps({"run_id": run_id, **row}) + "\n")

    jsonl("metrics.jsonl", raw["metrics"])
    jsonl("timeline.jsonl", raw["timeline"])
    jsonl("trajectories.jsonl", raw["ledger"] or [])
    (out / "config.yaml").write_text(yaml.safe_dump(_config_view(scenario), sort_keys=False))
    summary = {
        "run_id": run_id,
        "simulated": True,
        "steps": result.steps,
        "rl_wall_s": result.sim_time_s,
        "trained_tokens": result.trained_tokens,
        "trained_samples": raw["trained_samples"],
        "trained_tokens_per_s": result.whole_run_tokens_per_s,
        "max_staleness": scenario.max_staleness,
        "max_staleness_seen": result.max_staleness_seen,
        "staleness_hist": result.staleness_hist,
        "admitted_prompts": result.groups["admitted"],
        "filtered_groups": result.groups["filtered"],
        "stale_groups": result.groups["stale"],
        "engine_generated_tokens": result.generated_tokens,
        "ledger_kept": raw["ledger"] is not None,
        "result": result.as_row(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return out
