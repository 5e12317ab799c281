"""Adaptive staleness (``controller.adaptive``): the admission setting chosen online from measurements.

Owns ``AdaptivePolicy``, a pure object (no clock, no I/O): ``update(StepObservation) ->
AdmissionSetting`` once per training step. The controller (``controller.loop``) and the simulator
(``sim.loop``) both call it and apply the setting to the same ``StalenessGate`` between two steps.

The setting has two levers, both within the user's bound η_max (``controller.max_staleness``):

- ``high_water_batches`` (the mark, ≥ 1 batch): how far the engine may run ahead of the trainer.
  It sets how many samples the engine generates at once and so, in the common case, both the
  throughput the trainer sees and the staleness of what it trains.
- ``max_staleness`` (η_t, ≥ mark − 1, so that the mark is what binds admission): the staleness
  budget of new admissions and the bound each admitted group is checked against when trained
  (``GroupBuffer.put(group, η_t)``). The slack η_t − (mark − 1) is for stragglers: with none, a
  group admitted last under a full mark is trained exactly η_t versions later if nothing finishes
  out of order, and dropped otherwise. The start is η_t = η_max, mark 2 (at most η_max + 1): the
  most slack the user allows at that mark (none for η_max ≤ 1). Slack costs no throughput (the
  mark binds admission) and a group keeps the bound it was admitted under for its whole life, so
  a low start loses the long groups admitted
  before the first drop is seen (on ``bench async``'s ``long``, a start at η_t = 2 lost 36-45 groups a
  30-step run, docs/controller.md §5.5); the mark sets how far generation runs ahead, and so the
  staleness, and the probes down lower both.

What it measures (``StepObservation``, one per step): the share of the step the trainer waited for a
batch, the engine's slot occupancy while it decoded, the importance-weight second moment E[w²] and
the share of capped tokens of the trained batch (``behav_weight_sq_mean``, ``behav_capped_frac`` of
the trainer's step metrics), and the groups dropped as too stale. Each is smoothed (exponential
average, weight ``SMOOTHING``); the wait, occupancy and stale shares start afresh at every change
(they measure the setting, and the old one's would make the next decision overshoot), the
off-policy statistics do not (they measure samples admitted under earlier settings anyway). Rules,
checked in this order at most once per step:

1. **Off-policy degrades** (E[w²] or the capped share above its limit): η_t is lowered by one and
   a ceiling is set there (the mark follows: ≤ η_t + 1); the ceiling rises by one again after
   ``RELAX_STEPS`` steps without degradation. Acts at most every ``DWELL_STEPS``.
2. **Groups are dropped as stale** (share above ``STALE_SHARE`` since the last change): η_t + 1,
   more slack for stragglers with the mark unchanged (generation thrown away costs throughput as
   soon as the trainer waits for its replacement). At the ceiling the drops are what the bound
   costs: they change nothing by themselves, and no cut of the mark (that would trade more
   throughput than the drops lose: on ``long`` η = 8 at mark 2 drops 5-8% of its groups and is
   still the best fixed setting); rule 3 may still raise the mark there, which shrinks the slack.
   Acts at most every ``DWELL_STEPS``.
3. **The trainer starves** (wait share above ``wait_target``): if the engine has free slots
   (occupancy below ``FULL_OCCUPANCY``, or unknown) and the pipeline has refilled since the last
   change (mark + 1 steps: before that the wait still shows the refill, and raising on it
   overshoots), the mark + 1 and η_t + 1 (the slack kept below the ceiling; at it η_t stays
   and the slack shrinks by one, down to none at mark η_t + 1). A
   starving trainer with a full engine is generation-bound at capacity: running further ahead would
   raise staleness, not throughput, so the mark holds. Acts at most every ``DWELL_STEPS``.
4. **The trainer never waits** (wait share below a quarter of the target, the hysteresis band):
   a probe down, η_t − 1 and the mark − 1 (not below 1: the slack then shrinks). If the next change is a raise for
   starvation, the probe was too low and the next one waits twice as long (from ``PROBE_STEPS``
   to at most ``MAX_PROBE_STEPS``), so a setting that is just enough is left alone.

Never: η_t above η_max, the mark above η_max + 1 (where it stops binding) or below 1.

``AdaptiveAdmission`` binds a policy to a ``StalenessGate``: one ``step(metrics)`` per training step
with the step's ``metrics.jsonl`` line (the controller's ``controller.metrics.step_metrics`` or the
simulator's, which share the keys read here), the new setting applied to the gate, and the keys it
adds to that line returned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from asyncrl.config import ControllerConfig
from asyncrl.controller.staleness import StalenessGate

SMOOTHING = 0.5
"""Weight of the newest step in every exponential average."""
FULL_OCCUPANCY = 0.9
"""Slot occupancy at which the engine counts as full (running further ahead adds no throughput)."""
DWELL_STEPS = 2
"""Steps after any change before a raise or an off-policy cut (the new setting must reach a batch)."""
PROBE_STEPS = 8
"""Steps after any change before the first probe down."""
MAX_PROBE_STEPS = 64
"""Longest wait between probes down (after repeated probes that made the trainer starve)."""
RELAX_STEPS = 20
"""Steps without off-policy degradation after which the ceiling set by one rises by one."""
STALE_SHARE = 0.05
"""Share of groups dropped as stale (smoothed) above which a starving trainer gets more η slack."""


@dataclass(frozen=True)
class AdmissionSetting:
    """What admission uses until the next step: ``StalenessGate.max_staleness`` and its mark."""

    max_staleness: int
    """η_t: the staleness budget of admissions now and the bound of the groups admitted under it."""
    high_water_batches: int
    """The mark in batches (``StalenessGate.high_water = high_water_batches * batch_size``)."""


@dataclass(frozen=True)
class StepObservation:
    """What one training step measured (the controller's ``metrics.jsonl`` line or the simulator's)."""

    wait_s: float
    """Seconds the trainer waited for this step's batch."""
    wall_s: float
    """Seconds since the previous step ended (wait + train + weight sync)."""
    engine_occupancy: float | None = None
    """Share of the engine's decode slots busy while it decoded during the step; None: not reported."""
    weight_sq_mean: float | None = None
    """E[w²] of the trained tokens (``behav_weight_sq_mean``); None: not measured (a simulation)."""
    capped_frac: float | None = None
    """Share of trained tokens capped by ``algo.behav_cap`` (``behav_capped_frac``); None: not measured."""
    stale_groups: int = 0
    """Groups dropped as too stale while this step's batch was taken."""
    batch_groups: int = 1
    """Groups trained at this step (B)."""


@dataclass(frozen=True)
class AdaptiveLimits:
    """The bound (``controller.max_staleness``) and the policy's targets (a run uses these defaults;
    the simulator and the tests may set others)."""

    bound: int
    """η_max: η_t never exceeds it."""
    wait_target: float = 0.05
    """Share of a step the trainer may wait for a batch before admission is raised (5%: what a
    trainer-bound run at the default mark waits, the probes' scheduling noise)."""
    weight_sq_limit: float = 2.0
    """E[w²] above which η_t is lowered (docs/algorithms.md §5.3-5.4: above ~4 before every degradation
    seen, 1.0-1.6 where none was: the limit sits between)."""
    capped_limit: float = 0.02
    """Share of tokens capped by ``algo.behav_cap`` above which η_t is lowered."""

    def __post_init__(self) -> None:
        if (
            self.bound < 0
            or not 0 < self.wait_target < 1
            or self.weight_sq_limit <= 1
            or not 0 <= self.capped_limit <= 1
        ):
            raise ValueError(
                f"AdaptiveLimits: bound >= 0, 0 < wait_target < 1, weight_sq_limit > 1 and "
                f"0 <= capped_limit <= 1 required, got {self}"
            )


class AdaptivePolicy:
    """The online admission setting (see the module docstring)."""

    def __init__(self, limits: AdaptiveLimits) -> None:
        self.limits = limits
        self.ceiling = limits.bound
        """η_t's ceiling (η_max, lowered where off-policy statistics degraded)."""
        self.eta = limits.bound
        self.mark = min(2, self.eta + 1)
        self.wait_share: float | None = None
        self.occupancy: float | None = None
        self.weight_sq: float | None = None
        self.capped: float | None = None
        self.stale_share = 0.0
        self.since_change = 0
        self.since_degraded = 0
        self.probe_steps = PROBE_STEPS
        self.probed = False
        """The last change was a probe down."""
        self.last_reason = "start"
        """Why the setting is what it is: start | hold | offpolicy | starving | stale | surplus."""

    @property
    def setting(self) -> AdmissionSetting:
        return AdmissionSetting(self.eta, self.mark)

    def update(self, obs: StepObservation) -> AdmissionSetting:
        """One step measured: the setting for the admissions until the next step."""
        self._smooth(obs, settled=self.since_change > 0)
        self.since_change += 1
        self.since_degraded += 1
        self.last_reason = self._decide()
        if self.last_reason != "hold":  # what the setting drives is measured afresh under the new one
            self.since_change = 0
            self.wait_share, self.occupancy, self.stale_share = None, None, 0.0
        return self.setting

    def _smooth(self, obs: StepObservation, settled: bool) -> None:
        """Fold ``obs`` into the averages; the first step after a change (or the run's first: the
        pipeline filling) is a transition and counts only for the off-policy statistics."""
        self.weight_sq = _ema(self.weight_sq, obs.weight_sq_mean)
        self.capped = _ema(self.capped, obs.capped_frac)
        if not settled:
            return
        wait = min(1.0, max(0.0, obs.wait_s / obs.wall_s)) if obs.wall_s > 0 else 0.0
        stale = obs.stale_groups / max(1, obs.stale_groups + obs.batch_groups)
        self.wait_share = _ema(self.wait_share, wait)
        self.occupancy = _ema(self.occupancy, obs.engine_occupancy)
        self.stale_share = SMOOTHING * stale + (1 - SMOOTHING) * self.stale_share

    def _degraded(self) -> bool:
        lim = self.limits
        return (self.weight_sq is not None and self.weight_sq > lim.weight_sq_limit) or (
            self.capped is not None and self.capped > lim.capped_limit
        )

    def _decide(self) -> str:
        """Apply the first rule that fires (module docstring); returns its name."""
        lim, wait = self.limits, self.wait_share or 0.0
        if self._degraded():
            self.since_degraded = 0
            if self.since_change >= DWELL_STEPS and self.eta > 0:
                self.ceiling = self.eta - 1
                self._set(self.ceiling, min(self.mark, self.ceiling + 1))
                return "offpolicy"
            return "hold"
        if self.since_degraded >= RELAX_STEPS and self.ceiling < lim.bound:
            self.ceiling += 1
            self.since_degraded = 0
        full = self.occupancy is not None and self.occupancy >= FULL_OCCUPANCY
        starving = wait > lim.wait_target
        if self.since_change >= DWELL_STEPS:
            if self.stale_share > STALE_SHARE and self.eta < self.ceiling:  # generation thrown away
                self._set(self.eta + 1, self.mark)
                return "stale"
            refilled = self.since_change >= self.mark + 1  # the pipeline refilled under the new mark
            if starving and not full and refilled and self.mark < self.ceiling + 1:
                if self.probed:  # the probe down went too low: wait longer before the next one
                    self.probe_steps = min(MAX_PROBE_STEPS, 2 * self.probe_steps)
                self._set(self.eta + 1, self.mark + 1)  # the slack η_t - (mark - 1) kept
                return "starving"
        if starving:
            return "hold"
        if wait < lim.wait_target / 4 and self.since_change >= self.probe_steps and self.eta > 0:
            self._set(self.eta - 1, self.mark - 1)  # the slack kept while the mark can go lower
            self.probed = True
            return "surplus"
        return "hold"

    def _set(self, eta: int, mark: int) -> None:
        self.eta = max(0, min(eta, self.ceiling))
        self.mark = max(1, min(mark, self.eta + 1))
        self.probed = False

    def state_dict(self) -> dict[str, float | int | bool | str | None]:
        """Everything ``load_state_dict`` needs to go on where it was (saved with a checkpoint)."""
        keys = (
            "ceiling",
            "mark",
            "eta",
            "wait_share",
            "occupancy",
            "weight_sq",
            "capped",
            "stale_share",
            "since_change",
            "since_degraded",
            "probe_steps",
            "probed",
            "last_reason",
        )
        return {k: getattr(self, k) for k in keys}

    def load_state_dict(self, state: dict[str, float | int | bool | str | None]) -> None:
        """Go on from ``state_dict``'s values, within this policy's limits (a resume may lower the bound)."""
        for key, value in state.items():
            if hasattr(self, key) and key != "limits":
                setattr(self, key, value)
        probed = bool(self.probed)
        self.ceiling = min(int(self.ceiling), self.limits.bound)
        self._set(int(self.eta), int(self.mark))
        self.probed = probed


def _ema(old: float | None, new: float | None) -> float | None:
    if new is None:
        return old
    return new if old is None else SMOOTHING * new + (1 - SMOOTHING) * old


def observation_of(metrics: Mapping[str, Any], stale_groups: int, batch_groups: int) -> StepObservation:
    """A step's observation from its ``metrics.jsonl`` line (absent or null statistics: not measured)."""

    def number(key: str) -> float | None:
        value = metrics.get(key)
        return None if value is None else float(value)

    return StepObservation(
        wait_s=float(metrics["wait_for_batch_s"]),
        wall_s=float(metrics["step_wall_s"]),
        engine_occupancy=number("engine_slot_occupancy"),
        weight_sq_mean=number("behav_weight_sq_mean"),
        capped_frac=number("behav_capped_frac"),
        stale_groups=stale_groups,
        batch_groups=batch_groups,
    )


class AdaptiveAdmission:
    """An ``AdaptivePolicy`` that sets ``gate`` (see the module docstring)."""

    def __init__(self, limits: AdaptiveLimits, gate: StalenessGate, batch_size: int) -> None:
        self.policy = AdaptivePolicy(limits)
        self.gate = gate
        self.batch_size = batch_size
        self.stale_total = 0
        """``stale_groups_total`` of the previous step's line (the drops of a step are the difference)."""
        self.apply()

    def apply(self) -> None:
        """The policy's setting onto the gate (its η for admissions from now on, and its mark)."""
        setting = self.policy.setting
        self.gate.max_staleness = setting.max_staleness
        self.gate.high_water = setting.high_water_batches * self.batch_size

    def step(self, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """One training step's line in; the gate set for the next admissions; the keys for that line out:
        ``adaptive_max_staleness`` and ``adaptive_high_water_batches`` (the setting chosen, in force
        from now) and ``adaptive_reason`` (the rule that chose it: ``AdaptivePolicy.last_reason``)."""
        total = int(metrics.get("stale_groups_total", self.stale_total))
        stale, self.stale_total = max(0, total - self.stale_total), total
        setting = self.policy.update(observation_of(metrics, stale, self.batch_size))
        self.apply()
        return {
            "adaptive_max_staleness": setting.max_staleness,
            "adaptive_high_water_batches": setting.high_water_batches,
            "adaptive_reason": self.policy.last_reason,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.state_dict(), "stale_total": self.stale_total}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.policy.load_state_dict(dict(state["policy"]))
        self.stale_total = int(state["stale_total"])
        self.apply()


def adaptive_admission(c: ControllerConfig, gate: StalenessGate) -> AdaptiveAdmission | None:
    """The ``controller.adaptive`` admission of a run (None: off, the gate keeps the config's setting)."""
    if not c.adaptive:
        return None
    return AdaptiveAdmission(AdaptiveLimits(c.max_staleness), gate, c.batch_size)


def setting_means(
    metrics: Sequence[Mapping[str, Any]], max_staleness: int, high_water_batches: int
) -> dict[str, float]:
    """η and the mark in force averaged over a run's steps (``eta_mean``, ``high_water_mean``): the chosen
    ones of ``AdaptiveAdmission.step``'s keys, the fixed ones given here where a line has none; the fixed
    ones for a run with no step. A real run's (``bench adaptive``) and a simulated one's (``sim.output``)."""

    def mean(key: str, fixed: int) -> float:
        return sum(float(m.get(key, fixed)) for m in metrics) / len(metrics) if metrics else float(fixed)

    return {
        "eta_mean": mean("adaptive_max_staleness", max_staleness),
        "high_water_mean": mean("adaptive_high_water_batches", high_water_batches),
    }
