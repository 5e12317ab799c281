"""The planner behind ``asyncrl plan``: which inference:training split, η, high-water mark and interrupt mode
to run a workload with on a device budget, each candidate predicted by the simulator itself.

Owns the candidate settings (``Setting``: a ``Split`` of the devices into engines and trainer ranks and the
three admission choices), the search (``plan``: every candidate is one ``sim.run.simulate`` call on the
workload's scenario, nothing else predicts anything), the rule that recommends one (``choose``) and the
config overrides of a setting (``setting_overrides``, ready for ``asyncrl train --set``).

The rule (``RULE``): among the candidates whose predicted steady-state throughput is at least
``target_fraction`` (default 0.95) of the best candidate's, and (optionally) whose predicted mean staleness
is at most ``max_mean_staleness``, recommend the one with the lowest predicted mean staleness; ties go to
the smaller η, then the higher throughput. Throughput is the simulator's ``steady_state_tokens_per_s``
(``controller.throughput``'s definition, the one real runs are measured by).

The search, in two phases when the budget can be split several ways (``docs/simulator.md`` §9):

1. *splits*: every split (inference fractions ``split_fractions`` of the devices, whole engines and ranks)
   at two corners, synchronous (η = 0) and the most asynchronous (η = the bound, no mark, in the
   workload's interrupt mode);
2. *grid*: at the ``refine_splits`` best splits (the best of each corner first), every η of ``etas`` up to
   the bound x every mark of ``marks`` x every interrupt mode of ``modes`` (η = 0 once: nothing is in
   flight at an update and the mark never binds).

3. *confirm*: the candidates predicted within twice the rule's margin of the best (at least 3, at most
   ``confirm``) simulated again over three times the horizon; the rule chooses among these.

Phases 1-2 simulate ``steps`` training steps per candidate (``auto``: enough steps for ~150,000 samples,
at least 20, at most 200), one seed: a short horizon, so that a 512-device plan takes a minute or two. A
short horizon under-states throughput the more inventory a setting holds at the end (in flight, buffered:
the steady-state measure counts it as generated and not trained, as it does for a real run), so a
short horizon leans toward small η and small marks (``docs/simulator.md`` §9). Phase 3's longer horizon
is what the rule reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from asyncrl.choices import InterruptMode, check_choice
from asyncrl.sim.output import SimResult
from asyncrl.sim.plan_workloads import PlanWorkload
from asyncrl.sim.profile import CostProfile
from asyncrl.sim.scenario import Scenario, with_overrides

RULE = (
    "among the confirmed candidates (re-simulated over 3x the search horizon), those predicted at >= "
    "{target:.0%} of the best steady-state throughput{cap}; of these the lowest predicted mean staleness "
    "(ties: smaller eta, then higher throughput)"
)
DEFAULT_SPLIT_FRACTIONS = (0.25, 0.375, 0.5, 0.625, 0.75, 0.875)
DEFAULT_MARKS = (0, 1, 2, 4)
SAMPLES_PER_CANDIDATE = 150_000
CONFIRM_HORIZON_FACTOR = 3


@dataclass(frozen=True)
class Split:
    """The device budget split into rollout engines and data-parallel trainer ranks."""

    engines: int
    trainer_ranks: int


@dataclass(frozen=True)
class Setting:
    """One candidate: a split and the admission choices (``controller.*`` / ``rollout.*`` meanings)."""

    split: Split
    max_staleness: int
    high_water_batches: int
    """0: no mark."""
    interrupt_mode: InterruptMode

    def label(self) -> str:
        mark = f"hw{self.high_water_batches}" if self.high_water_batches else "no-mark"
        return f"{self.split.engines}e:{self.split.trainer_ranks}t eta{self.max_staleness} {mark} {self.interrupt_mode}"


@dataclass(frozen=True)
class Prediction:
    """The simulator's figures of one candidate."""

    setting: Setting
    phase: str
    """splits | grid | confirm (module docstring)."""
    steps: int
    """Simulated training steps."""
    steady_state_tokens_per_s: float
    whole_run_tokens_per_s: float
    staleness_mean: float
    max_staleness_seen: int
    engine_busy_frac: float
    engine_occupancy: float
    trainer_busy_frac: float
    interruptions_per_sample: float
    stale_groups: int
    sim_time_s: float
    cpu_s: float

    @staticmethod
    def of(setting: Setting, phase: str, r: SimResult) -> Prediction:
        return Prediction(
            setting,
            phase,
            r.steps,
            r.steady_state_tokens_per_s,
            r.whole_run_tokens_per_s,
            r.staleness_mean,
            r.max_staleness_seen,
            r.engine_busy_frac,
            r.engine_occupancy,
            r.trainer_busy_frac,
            r.interruptions_per_sample,
            r.groups.get("stale", 0),
            r.sim_time_s,
            r.cpu_s,
        )

    def as_row(self) -> dict[str, Any]:
        row = asdict(self)
        setting = row.pop("setting")
        return {"label": self.setting.label(), **setting.pop("split"), **setting, **row}


@dataclass(frozen=True)
class PlanRequest:
    """What to plan: a profile, a workload, a device budget, the user's bound on η and the rule's target."""

    profile: CostProfile
    workload: PlanWorkload
    devices: int
    max_staleness: int = 8
    """The user's bound: no candidate has a larger η."""
    target_fraction: float = 0.95
    max_mean_staleness: float | None = None
    etas: tuple[int, ...] = ()
    """η values to try (empty: 0, the powers of two below the bound, and the bound)."""
    marks: tuple[int, ...] = DEFAULT_MARKS
    modes: tuple[InterruptMode, ...] = ("abort", "keep")
    split_fractions: tuple[float, ...] = DEFAULT_SPLIT_FRACTIONS
    refine_splits: int = 2
    confirm: int = 8
    """Most candidates re-simulated over the longer horizon (phase 3)."""
    steps: int = 0
    """Simulated training steps per candidate (0: auto, module docstring)."""
    seed: int = 0

    def __post_init__(self) -> None:
        check_request(self)


@dataclass(frozen=True)
class Plan:
    request: PlanRequest
    predictions: tuple[Prediction, ...]
    recommended: Prediction
    rule: str
    steps: int
    """The search's simulated horizon (phase 3: ``CONFIRM_HORIZON_FACTOR`` times it)."""
    wall_s: float


def check_request(r: PlanRequest) -> None:
    """Raises ``ValueError`` naming the first input that cannot be planned."""
    need = r.profile.engine.devices + r.profile.trainer.devices_per_rank
    if r.devices < 2:
        raise ValueError(f"--devices must be at least 2 (one engine and one trainer rank), got {r.devices}")
    if r.devices < need:
        e_dev, r_dev = r.profile.engine.devices, r.profile.trainer.devices_per_rank
        raise ValueError(
            f"--devices {r.devices}: profile {r.profile.name!r} needs {need} (an engine of {e_dev}, a trainer rank of "
            f"{r_dev})"
        )
    if r.max_staleness < 0 or any(e < 0 for e in r.etas) or any(m < 0 for m in r.marks) or not r.marks:
        raise ValueError("--max-staleness, --etas and --marks must be >= 0 (and --marks not empty)")
    if any(e > r.max_staleness for e in r.etas):
        raise ValueError(f"--etas {list(r.etas)} exceed the bound --max-staleness {r.max_staleness}")
    if not 0.0 < r.target_fraction <= 1.0:
        raise ValueError(f"--target must be in (0, 1], got {r.target_fraction}")
    if r.max_mean_staleness is not None and r.max_mean_staleness < 0:
        raise ValueError("--max-mean-staleness must be >= 0")
    if not r.modes:
        raise ValueError("--modes: at least one of abort, keep")
    for mode in r.modes:
        check_choice(mode, InterruptMode, "--modes")
    if not r.split_fractions or not all(0.0 < f < 1.0 for f in r.split_fractions):
        raise ValueError("--splits: inference fractions in (0, 1)")
    if r.refine_splits < 1 or r.steps < 0 or r.confirm < 1:
        raise ValueError("--refine-splits and --confirm must be >= 1, --steps >= 0")


def eta_grid(bound: int, etas: tuple[int, ...] = ()) -> list[int]:
    """``etas`` if given, else 0, the powers of two below ``bound``, and ``bound``."""
    if etas:
        return sorted(set(etas))
    return sorted({0, bound, *(2**k for k in range(bound.bit_length()) if 2**k < bound)})


def splits(devices: int, profile: CostProfile, fractions: Iterable[float]) -> list[Split]:
    """Distinct splits of ``devices`` whose inference share is near each fraction (at least one engine and
    one rank; whole engines of ``engine.devices``, ranks of ``trainer.devices_per_rank``)."""
    e_dev, r_dev = profile.engine.devices, profile.trainer.devices_per_rank
    out: dict[Split, None] = {}
    for f in sorted(fractions):
        engines = max(1, min(round(devices * f / e_dev), (devices - r_dev) // e_dev))
        ranks = (devices - engines * e_dev) // r_dev
        if engines >= 1 and ranks >= 1:
            out[Split(engines, ranks)] = None
    return list(out)


def horizon(request: PlanRequest) -> int:
    """Simulated steps per candidate: ``request.steps``, else ~150,000 samples within [20, 200]."""
    if request.steps:
        return request.steps
    per_step = request.workload.scenario["batch_size"] * request.workload.scenario["group_size"]
    return max(20, min(200, math.ceil(SAMPLES_PER_CANDIDATE / per_step)))


def candidate_settings(split: Split, request: PlanRequest) -> list[Setting]:
    """The grid at one split: η = 0 once (the workload's mark and mode), then every η x mark x mode."""
    wl = request.workload.scenario
    out = []
    for eta in eta_grid(request.max_staleness, request.etas):
        if eta == 0:
            out.append(Setting(split, 0, int(wl.get("high_water_batches", 0)), wl.get("interrupt_mode", "abort")))
            continue
        marks = sorted({m for m in request.marks if m <= eta})  # a mark above η never binds: it is no mark
        out.extend(Setting(split, eta, m, mode) for m in marks for mode in request.modes)
    return out


def corner_settings(split: Split, request: PlanRequest) -> list[Setting]:
    """Phase 1's two corners at a split: synchronous, and the bound with no mark."""
    mode = request.workload.scenario.get("interrupt_mode", "abort")
    sync = Setting(split, 0, int(request.workload.scenario.get("high_water_batches", 0)), mode)
    if request.max_staleness == 0:
        return [sync]
    return [sync, Setting(split, request.max_staleness, 0, mode)]


def scenario_of(setting: Setting, request: PlanRequest, steps: int) -> Scenario:
    """The simulated scenario of a candidate: the workload's keys, the setting, the profile, the horizon."""
    keys = {
        **request.workload.scenario,
        "profile": request.profile.name,
        "gpus": 0,
        "engines": setting.split.engines,
        "trainer_ranks": setting.split.trainer_ranks,
        "max_staleness": setting.max_staleness,
        "high_water_batches": setting.high_water_batches,
        "interrupt_mode": setting.interrupt_mode,
        "total_steps": steps,
        "seed": request.seed,
        "ledger_rows": 0,
        "timeline_lines": 200,
    }
    return with_overrides(Scenario(), keys)


def feasible(
    predictions: Iterable[Prediction], target_fraction: float, max_mean_staleness: float | None
) -> list[Prediction]:
    """The candidates the rule chooses among (module docstring)."""
    preds = list(predictions)
    best = max(p.steady_state_tokens_per_s for p in preds)
    return [
        p
        for p in preds
        if p.steady_state_tokens_per_s >= target_fraction * best
        and (max_mean_staleness is None or p.staleness_mean <= max_mean_staleness)
    ]


def choose(
    predictions: Iterable[Prediction], target_fraction: float = 0.95, max_mean_staleness: float | None = None
) -> Prediction:
    """The rule (``RULE``): lowest mean staleness within ``target_fraction`` of the best throughput (and under
    ``max_mean_staleness``); ties to the smaller η, then the higher throughput. Raises ``ValueError`` when
    no candidate meets the staleness cap."""
    preds = list(predictions)
    if not preds:
        raise ValueError("no candidate was simulated")
    ok = feasible(preds, target_fraction, max_mean_staleness)
    if not ok:
        lowest = min(
            p.staleness_mean
            for p in preds
            if p.steady_state_tokens_per_s >= target_fraction * max(q.steady_state_tokens_per_s for q in preds)
        )
        raise ValueError(
            f"no candidate within {target_fraction:.0%} of the best throughput has mean staleness <= "
            f"{max_mean_staleness} (the lowest such is {lowest:.2f}): raise --max-mean-staleness or lower --target"
        )
    return min(ok, key=lambda p: (round(p.staleness_mean, 6), p.setting.max_staleness, -p.steady_state_tokens_per_s))


def rule_text(target_fraction: float, max_mean_staleness: float | None) -> str:
    cap = "" if max_mean_staleness is None else f" and mean staleness <= {max_mean_staleness}"
    return RULE.format(target=target_fraction, cap=cap)


Evaluate = Callable[[Setting, Scenario], SimResult]
"""Simulates one candidate (``plan``'s default: ``sim.run.simulate`` under the request's profile)."""


def _keep_splits(corners: list[Prediction], request: PlanRequest) -> list[Split]:
    """The splits phase 2 searches: the best split of each corner (the most asynchronous corner first), then
    the others by their best corner's throughput."""
    ordered: dict[Split, None] = {}
    for eta in sorted({p.setting.max_staleness for p in corners}, reverse=True):
        at = [p for p in corners if p.setting.max_staleness == eta]
        ordered[max(at, key=lambda p: p.steady_state_tokens_per_s).setting.split] = None
    for p in sorted(corners, key=lambda p: -p.steady_state_tokens_per_s):
        ordered[p.setting.split] = None
    return list(ordered)[: request.refine_splits]


def to_confirm(searched: list[Prediction], request: PlanRequest) -> list[Setting]:
    """Phase 3's candidates: within twice the rule's margin of the best, at least 3, at most ``confirm``."""
    ranked = sorted(searched, key=lambda p: -p.steady_state_tokens_per_s)
    floor = (1.0 - 2.0 * (1.0 - request.target_fraction)) * ranked[0].steady_state_tokens_per_s
    near = [p for p in ranked if p.steady_state_tokens_per_s >= floor]
    return [p.setting for p in (near if len(near) >= 3 else ranked[:3])[: request.confirm]]


def plan(request: PlanRequest, evaluate: Evaluate | None = None, progress: bool = True) -> Plan:
    """Search the candidates (module docstring) and recommend one by the rule."""
    import time

    from tqdm import tqdm

    from asyncrl.sim.run import simulate

    def default_evaluate(setting: Setting, scenario: Scenario) -> SimResult:
        return simulate(scenario, request.profile).result

    run = evaluate or default_evaluate
    t0 = time.perf_counter()
    steps = horizon(request)
    all_splits = splits(request.devices, request.profile, request.split_fractions)
    if not all_splits:
        raise ValueError(f"--devices {request.devices} cannot be split into an engine and a trainer rank")
    done: dict[tuple[Setting, str], Prediction] = {}
    bar = tqdm(total=0, desc="plan", unit="sim", disable=not progress, dynamic_ncols=True)

    def simulate_all(settings: list[Setting], phase: str, horizon_steps: int) -> list[Prediction]:
        key = "confirm" if phase == "confirm" else "search"
        todo = list(dict.fromkeys(s for s in settings if (s, key) not in done))
        bar.total += len(todo)
        bar.refresh()
        for s in todo:
            bar.set_postfix_str(f"{phase}: {s.label()}")
            done[(s, key)] = Prediction.of(s, phase, run(s, scenario_of(s, request, horizon_steps)))
            bar.update(1)
        return [done[(s, key)] for s in dict.fromkeys(settings)]

    try:
        kept = all_splits
        if len(all_splits) > 1:
            corners = simulate_all([c for sp in all_splits for c in corner_settings(sp, request)], "splits", steps)
            kept = _keep_splits(corners, request)
        simulate_all([c for sp in kept for c in candidate_settings(sp, request)], "grid", steps)
        searched = [p for (_, key), p in done.items() if key == "search"]
        confirmed = simulate_all(to_confirm(searched, request), "confirm", steps * CONFIRM_HORIZON_FACTOR)
    finally:
        bar.close()
    best = choose(confirmed, request.target_fraction, request.max_mean_staleness)
    rule = rule_text(request.target_fraction, request.max_mean_staleness)
    return Plan(request, tuple(done.values()), best, rule, steps, time.perf_counter() - t0)


def setting_overrides(setting: Setting, request: PlanRequest) -> list[str]:
    """The ``asyncrl train --set`` overrides of a setting. The split needs the Ray launcher unless it is one
    engine and one rank (the local launcher's only split: the engine thread and the trainer process, a core
    each on this machine); the Ray split asks for the profile's devices per engine and per rank as GPUs."""
    out = []
    sp = setting.split
    slots = request.workload.scenario.get("slots") or request.profile.engine.max_slots
    if (sp.engines, sp.trainer_ranks) != (1, 1):
        out += [
            "launch.kind=ray",
            f"rollout.num_engines={sp.engines}",
            f"launch.trainer_ranks={sp.trainer_ranks}",
            f"launch.gpus_per_engine={request.profile.engine.devices}",
            f"launch.gpus_per_trainer={request.profile.trainer.devices_per_rank}",
            f"rollout.max_slots={slots}",
        ]
    out += [
        f"controller.max_staleness={setting.max_staleness}",
        f"controller.high_water_batches={setting.high_water_batches}",
        f"rollout.interrupt_mode={setting.interrupt_mode}",
    ]
    return out
