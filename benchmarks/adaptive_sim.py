"""The simulated mode of ``python -m benchmarks adaptive``: each arm as an ``asyncrl simulate`` run.

Owns ``SIM_WORKLOADS`` (the scenario keys standing for ``bench async``'s workloads) and
``simulated_runner``, the ``bench.adaptive.RunOne`` that simulates an arm (fixed ``max_staleness``,
or ``adaptive=true`` with its bound) under a cost profile, the simulator seed standing for the run
seed. The simulator drives the controller's own gate and adaptive policy; it trains no policy, so
its rows have no accuracy and its adaptive policy never sees off-policy statistics.
"""

from __future__ import annotations

from typing import Any

from asyncrl.sim.run import simulate
from asyncrl.sim.scenario import Scenario, with_overrides
from benchmarks.adaptive import RunOne

__all__ = ["SIM_WORKLOADS", "simulated_row", "simulated_runner"]

SIM_WORKLOADS: dict[str, dict[str, Any]] = {
    "task": {},
    "long": {
        "batch_size": 8,
        "length_median": 450.0,
        "length_sigma": 0.9,
        "max_new_tokens": 2048,
        "prompt_len": 400,
        "high_water_unit": "samples",
        "interrupt_mode": "keep",
    },
}
"""Scenario keys of each workload: ``task`` the scenario defaults (B = 16 x 8, lognormal lengths
around 200 tokens), ``long`` an approximation of ``bench async``'s ``long`` (B = 8, long-tailed
lengths around 450 tokens up to 2048, long prompts, the mark counted in samples, ``keep``)."""


def simulated_row(profile: str, workload: str, seed: int, arm_overrides: list[str], steps: int) -> dict[str, Any]:
    """One simulated arm: ``workload``'s scenario with the arm's ``controller.*`` keys, ``seed``."""
    keys: dict[str, Any] = dict(SIM_WORKLOADS[workload], profile=profile, seed=seed, total_steps=steps)
    for item in arm_overrides:
        key, _, value = item.partition("=")
        keys[key.removeprefix("controller.")] = value
    r = simulate(with_overrides(Scenario(), keys)).result
    return {
        "steady_state_tokens_per_s": r.steady_state_tokens_per_s,
        "trained_tokens_per_s": r.whole_run_tokens_per_s,
        "accuracy_after": None,
        "staleness_mean": r.staleness_mean,
        "max_staleness_seen": r.max_staleness_seen,
        "eta_mean": r.eta_mean,
        "high_water_mean": r.high_water_mean,
        "stale_groups": r.groups["stale"],
        "engine_occupancy": r.engine_occupancy,
        "trainer_busy_frac": r.trainer_busy_frac,
    }


def simulated_runner(steps: int) -> RunOne:
    """The runner of ``bench adaptive --profile``: workload keys are ``profile/workload``."""

    def run(key: str, arm: str, seed: int, arm_overrides: list[str]) -> dict[str, Any]:
        profile, _, workload = key.partition("/")
        return simulated_row(profile, workload, seed, arm_overrides, steps)

    return run
