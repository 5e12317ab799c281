"""The workloads ``asyncrl plan`` sizes a run for: named ones, a real run's ledger, or a scenario file.

Owns ``PlanWorkload`` (the scenario keys of a workload: batch, group, lengths, prompt length, filter rate,
the controller settings the planner does not vary; and, for a workload this machine can run, the config
overrides of its real runs) and ``resolve_workload`` (a name, a run directory, or a scenario YAML).

Named workloads, each number with its source:

- ``task`` and ``long``: ``python -m benchmarks async``'s workloads (``data.workloads.WORKLOADS``): their
  controller and rollout settings come from the config those runs use (``scenario.from_config``), their
  response lengths from a log-normal fitted to the median and 90th percentile of the committed
  synchronous runs (``docs/results/bench_async_task_seeds*.json``: median 19, p90 35-41 tokens, 9 seeds;
  ``bench_async_long_samples_keep_seeds*.json``: median 283-391, p90 969-1255, 8 runs), split into a
  per-prompt and a within-group part with the simulator's default within-group spread (0.3, an
  assumption); prompt length and filter rate from the same rows (trained tokens per trained sample minus
  generated tokens per finished sample; filtered groups over finished groups);
- ``areal-math``: AReaL's math setup (arXiv 2505.24298; ``docs/results/sim_512gpu_scenario.yaml``):
  512 prompts x 16 samples per step, up to 27,648 new tokens, log-normal lengths of median 5,000 tokens
  (an assumption), no real-run config here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from asyncrl.sim.scenario import Scenario, from_config, from_run, load_scenario

WITHIN_GROUP_SIGMA = 0.3
"""Within-group log-normal spread of the named CPU workloads (``Scenario.length_within_sigma``'s default)."""
Z90 = 1.2816
"""The standard normal's 90th percentile: a log-normal's sigma is ln(p90 / p50) / Z90."""


@dataclass(frozen=True)
class PlanWorkload:
    """What is trained, independent of the setting the planner chooses."""

    name: str
    scenario: dict[str, Any]
    """Scenario keys (``sim.scenario.Scenario``) of the workload: batch, group, lengths, prompts, filter,
    and the controller settings the planner keeps (``high_water_unit``, ``max_concurrent``, ...)."""
    config_overrides: tuple[str, ...] = ()
    """``--set`` overrides of a real ``asyncrl train`` run of it on this machine (``bench async``'s
    workload), empty where none exists (a GPU workload, a ledger, a scenario file)."""
    source: str = ""
    """Where its numbers come from."""
    bench_workload: str = ""
    """The ``python -m benchmarks async`` workload name that runs it for real (``bench plan-check``), if any."""
    config_file: str = ""
    """A training config that runs it (a replayed run's ``config.yaml``), for ``asyncrl train --config``."""
    notes: dict[str, Any] = field(default_factory=dict)


def _lognormal(median: float, p90: float) -> dict[str, float]:
    total = math.log(p90 / median) / Z90
    between = math.sqrt(max(total**2 - WITHIN_GROUP_SIGMA**2, 0.0))
    return {"length_median": median, "length_sigma": round(between, 3), "length_within_sigma": WITHIN_GROUP_SIGMA}


def _bench_workload(name: str, median: float, p90: float, prompt_len: int, filter_prob: float, source: str) -> Any:
    from asyncrl.config import load_config
    from asyncrl.data.workloads import WORKLOADS

    overrides = tuple(WORKLOADS[name])
    base = from_config(load_config(None, list(overrides)))
    keys = (
        "batch_size",
        "group_size",
        "max_concurrent",
        "high_water_unit",
        "weight_sync",
        "max_new_tokens",
        "interrupt_mode",
        "high_water_batches",
    )
    scenario = {k: getattr(base, k) for k in keys}
    scenario.update(lengths="lognormal", prompt_len=prompt_len, filter_prob=filter_prob, **_lognormal(median, p90))
    return PlanWorkload(name, scenario, overrides, source, bench_workload=name)


def named_workloads() -> dict[str, PlanWorkload]:
    """The workloads ``--workload NAME`` accepts (module docstring)."""
    return {
        "task": _bench_workload(
            "task",
            19,
            37,
            10,
            0.29,
            "bench async `task`: the default arithmetic task (B=16 x G=8, up to 160 tokens); lengths fitted to "
            "median 19 / p90 37 of the 9 synchronous runs of docs/results/bench_async_task_seeds*.json; prompt "
            "~10 tokens and 29% of groups filtered (equal rewards) from the same rows",
        ),
        "long": _bench_workload(
            "long",
            350,
            1150,
            105,
            0.0,
            "bench async `long`: 256-operand problems from the long-trained policy (B=8 x G=8, up to 2,048 "
            "tokens, keep, mark in samples); lengths fitted to median ~350 / p90 ~1,150 of the synchronous "
            "runs of docs/results/bench_async_long_samples_keep_seeds*.json; prompt ~105 tokens (trained / "
            "generated tokens 1.21), no filter",
        ),
        "areal-math": PlanWorkload(
            "areal-math",
            {
                "batch_size": 512,
                "group_size": 16,
                "max_concurrent": 8192,
                "high_water_unit": "groups",
                "weight_sync": "inflight",
                "max_new_tokens": 27648,
                "interrupt_mode": "abort",
                "high_water_batches": 0,
                "lengths": "lognormal",
                "length_median": 5000,
                "length_sigma": 0.8,
                "length_within_sigma": 0.4,
                "prompt_len": 500,
                "filter_prob": 0.0,
            },
            (),
            "AReaL's math RL setup (arXiv 2505.24298, docs/results/sim_512gpu_scenario.yaml): 512 prompts x 16, "
            "up to 27,648 new tokens; log-normal lengths of median 5,000 tokens (an assumption)",
        ),
    }


PLANNED_KEYS = ("engines", "trainer_ranks", "gpus", "max_staleness", "high_water_batches", "interrupt_mode")
"""Scenario keys the planner sets itself (a workload's values for them are ignored or its default)."""


def resolve_workload(spec: str) -> PlanWorkload:
    """A named workload, a finished run's directory (its config, and its ledger's lengths replayed), or a
    scenario YAML file; anything else is an error naming the choices."""
    named = named_workloads()
    if spec in named:
        return named[spec]
    path = Path(spec)
    if path.is_dir():
        # the run's lengths and filter verdicts, drawn in a fresh order per simulator seed: a plan looks at
        # other settings than the run's, where its admission order says nothing (validation keeps it)
        s = replace(from_run(path), ledger_ordered=False)
        return PlanWorkload(
            f"run:{path.name}",
            _workload_keys(s),
            (),
            f"replayed from the ledger of {path}",
            config_file=str(path / "config.yaml"),
        )
    if path.is_file():
        s = load_scenario(path)
        return PlanWorkload(f"scenario:{path.name}", _workload_keys(s), (), f"scenario file {path}")
    raise ValueError(
        f"unknown workload {spec!r}: one of {', '.join(named)}, a run directory (its ledger is replayed), "
        "or a scenario YAML file"
    )


def _workload_keys(s: Scenario) -> dict[str, Any]:
    """A scenario's keys less the devices and the settings the planner chooses."""
    data = s.to_dict()
    for key in (
        *PLANNED_KEYS,
        "profile",
        "slots",
        "inference_fraction",
        "total_steps",
        "seed",
        "warmup_steps",
        "timeline_lines",
        "timeline_period_s",
        "ledger_rows",
    ):
        data.pop(key, None)
    return data
