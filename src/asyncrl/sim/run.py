"""One call from a scenario to its simulated figures: ``simulate``.

Owns the composition of the package (profile lookup, ``Simulator``, ``summarise``, the optional run
directory), so that the CLI, the tests and a planner call one function.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.sim.loop import Simulator
from asyncrl.sim.output import SimResult, summarise, write_run_dir
from asyncrl.sim.profile import CostProfile, load_profile
from asyncrl.sim.scenario import Scenario


@dataclass(frozen=True)
class Simulation:
    result: SimResult
    scenario: Scenario
    """The scenario as simulated (engines, ranks and slots resolved)."""
    raw: dict[str, Any]
    """The recorder's output: metrics, timeline, ledger (or None), counters."""


def simulate(scenario: Scenario, profile: CostProfile | None = None, run_dir: str | Path | None = None) -> Simulation:
    """Simulate ``scenario`` (under ``profile``, default the one it names); with ``run_dir``, also
    write a run directory that ``asyncrl report`` reads."""
    prof = profile if profile is not None else load_profile(scenario.profile)
    sim = Simulator(scenario, prof)
    raw = sim.run()
    result = summarise(raw, sim.s, prof.name)
    if run_dir is not None:
        write_run_dir(run_dir, raw, sim.s, result)
    return Simulation(result, sim.s, raw)
