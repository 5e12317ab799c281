"""``controller.adaptive.AdaptivePolicy`` on scripted observations: it raises admission when the trainer
starves and the engine has room, lowers η when off-policy statistics degrade or the trainer never waits,
never leaves the user's bound, and changes slowly (dwell, hysteresis band, backoff of failed probes)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from asyncrl.controller.adaptive import (
    DWELL_STEPS,
    PROBE_STEPS,
    RELAX_STEPS,
    AdaptiveLimits,
    AdaptivePolicy,
    AdmissionSetting,
    StepObservation,
    setting_means,
)

STARVING = StepObservation(wait_s=0.5, wall_s=1.0, engine_occupancy=0.3)
NEVER_WAITS = StepObservation(wait_s=0.0, wall_s=1.0, engine_occupancy=0.3)


def _drive(
    policy: AdaptivePolicy, obs: Callable[[AdmissionSetting], StepObservation], steps: int
) -> list[AdmissionSetting]:
    """``steps`` updates, each observation a function of the setting in force (a scripted plant)."""
    out = []
    for _ in range(steps):
        out.append(policy.update(obs(policy.setting)))
    return out


def _changes(settings: list[AdmissionSetting]) -> list[int]:
    return [i for i in range(1, len(settings)) if settings[i] != settings[i - 1]]


def _check_bounds(settings: list[AdmissionSetting], bound: int) -> None:
    for s in settings:
        assert 0 <= s.max_staleness <= bound
        assert 1 <= s.high_water_batches <= s.max_staleness + 1


def test_the_start_is_the_bound_with_a_mark_of_two() -> None:
    """All the slack the user allows from the first admission (a group keeps its admission's bound)."""
    assert AdaptivePolicy(AdaptiveLimits(bound=8)).setting == AdmissionSetting(8, 2)
    assert AdaptivePolicy(AdaptiveLimits(bound=1)).setting == AdmissionSetting(1, 2)
    assert AdaptivePolicy(AdaptiveLimits(bound=0)).setting == AdmissionSetting(0, 1)


def test_a_starving_trainer_raises_the_mark_slowly_up_to_the_bound() -> None:
    policy = AdaptivePolicy(AdaptiveLimits(bound=4))
    settings = _drive(policy, lambda s: STARVING, 30)
    _check_bounds(settings, 4)
    assert settings[-1] == AdmissionSetting(4, 5)
    marks = [s.high_water_batches for s in settings]
    assert marks == sorted(marks) and marks[0] == 2  # only up, one at a time
    assert {s.max_staleness for s in settings} == {4}
    assert all(b - a >= DWELL_STEPS for a, b in zip(_changes(settings), _changes(settings)[1:], strict=False))
    assert policy.last_reason == "hold"


def _below_the_ceiling(bound: int, eta: int, mark: int) -> AdaptivePolicy:
    """A policy at (η_t, mark) under the ceiling ``bound``, as after probes down."""
    policy = AdaptivePolicy(AdaptiveLimits(bound=bound))
    policy.load_state_dict({**policy.state_dict(), "eta": eta, "mark": mark})
    return policy


def test_a_starving_trainer_raises_eta_with_the_mark_below_the_ceiling() -> None:
    """After probes down (η_t below its ceiling) a raise for starvation moves both, the slack kept."""
    policy = _below_the_ceiling(8, 2, 2)
    settings = _drive(policy, lambda s: STARVING, 12)
    assert settings[-1] == AdmissionSetting(5, 5) and policy.last_reason in {"hold", "starving"}
    assert all(s.max_staleness - s.high_water_batches == 0 for s in settings)


def test_a_starving_trainer_with_a_full_engine_holds() -> None:
    policy = AdaptivePolicy(AdaptiveLimits(bound=8))
    full = StepObservation(wait_s=0.5, wall_s=1.0, engine_occupancy=0.97)
    assert set(_drive(policy, lambda s: full, 20)) == {AdmissionSetting(8, 2)}


def test_a_trainer_that_never_waits_lowers_eta_and_the_mark_to_synchronous() -> None:
    policy = AdaptivePolicy(AdaptiveLimits(bound=8))
    _drive(policy, lambda s: STARVING, 12)
    high = policy.setting
    assert high.max_staleness == 8  # at the bound from the start
    settings = _drive(policy, lambda s: NEVER_WAITS, 100)
    _check_bounds(settings, 8)
    assert settings[-1] == AdmissionSetting(0, 1)
    etas = [s.max_staleness for s in settings]
    assert etas == sorted(etas, reverse=True) and etas[0] <= high.max_staleness
    assert all(b - a >= PROBE_STEPS for a, b in zip(_changes(settings), _changes(settings)[1:], strict=False))


def test_a_wait_inside_the_hysteresis_band_changes_nothing() -> None:
    policy = AdaptivePolicy(AdaptiveLimits(bound=8, wait_target=0.1))
    band = StepObservation(wait_s=0.05, wall_s=1.0, engine_occupancy=0.5)  # between target / 4 and target
    assert set(_drive(policy, lambda s: band, 50)) == {AdmissionSetting(8, 2)}


def test_degraded_off_policy_statistics_lower_eta_below_what_starvation_asks_and_cap_it() -> None:
    policy = AdaptivePolicy(AdaptiveLimits(bound=8, weight_sq_limit=2.0))
    _drive(policy, lambda s: STARVING, 12)
    assert policy.setting.max_staleness == 8 and policy.setting.high_water_batches > 2

    def plant(s: AdmissionSetting) -> StepObservation:  # E[w²] grows with η: too off-policy above 2
        return StepObservation(0.5, 1.0, 0.3, weight_sq_mean=1.0 + 0.6 * s.max_staleness, capped_frac=0.0)

    settings = _drive(policy, plant, 26)
    # one cut every DWELL_STEPS until E[w²] (smoothed) is under the limit: at η 1 it is 1.6, at η 2 2.2
    assert [s.max_staleness for s in settings[:14]] == [8, 7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1]
    assert policy.ceiling == 1 and set(settings[13:]) == {AdmissionSetting(1, 2)}  # starving, held there
    assert policy.last_reason == "hold"


def test_the_capped_share_degrades_too_and_the_ceiling_relaxes_when_it_is_gone() -> None:
    policy = AdaptivePolicy(AdaptiveLimits(bound=6, capped_limit=0.02))
    _drive(policy, lambda s: STARVING, 12)
    capped = StepObservation(0.5, 1.0, 0.3, weight_sq_mean=1.1, capped_frac=0.2)
    _drive(policy, lambda s: capped, 30)
    low = policy.ceiling
    assert low < 6 and policy.setting.max_staleness <= low
    clean = StepObservation(0.5, 1.0, 0.3, weight_sq_mean=1.1, capped_frac=0.0)
    _drive(policy, lambda s: clean, RELAX_STEPS + 5)
    assert policy.ceiling == low + 1


def test_groups_dropped_as_stale_give_a_starving_trainer_slack_in_eta_not_in_the_mark() -> None:
    policy = _below_the_ceiling(8, 2, 2)
    stale = StepObservation(0.5, 1.0, 0.3, stale_groups=4, batch_groups=8)
    settings = _drive(policy, lambda s: stale, DWELL_STEPS)
    assert settings[-1] == AdmissionSetting(3, 2) and policy.last_reason == "stale"
    full = _below_the_ceiling(8, 2, 2)  # a full engine too: the drops are lost throughput
    stale_full = StepObservation(0.5, 1.0, 0.99, stale_groups=4, batch_groups=8)
    assert _drive(full, lambda s: stale_full, DWELL_STEPS)[-1] == AdmissionSetting(3, 2)


def test_groups_dropped_at_the_ceiling_change_nothing() -> None:
    """At the bound the drops are what the bound costs: neither η_t nor the mark moves for them (the engine
    full, so the starving rule does not raise the mark either)."""
    policy = AdaptivePolicy(AdaptiveLimits(bound=2))
    stale_full = StepObservation(0.5, 1.0, 0.99, stale_groups=4, batch_groups=8)
    assert set(_drive(policy, lambda s: stale_full, 10)) == {AdmissionSetting(2, 2)}


def test_failed_probes_down_back_off() -> None:
    """At the setting that is just enough (mark 3 here) every probe down starves the trainer: probes
    become rarer (doubling), so the run spends almost all its steps at the right setting."""
    policy = AdaptivePolicy(AdaptiveLimits(bound=8))

    def plant(s: AdmissionSetting) -> StepObservation:
        return NEVER_WAITS if s.high_water_batches >= 3 else STARVING

    waits = []  # the wait before the next probe, as set by each raise after a failed probe
    settings = []
    for _ in range(300):
        probed = policy.probed
        settings.append(policy.update(plant(policy.setting)))
        if probed and policy.last_reason == "starving":
            waits.append(policy.probe_steps)
    _check_bounds(settings, 8)
    assert waits == [16, 32, 64, 64, 64, 64]  # each failed probe doubles the wait once, up to 64
    probes = sum(1 for a, b in zip(settings, settings[1:], strict=False) if b.high_water_batches < a.high_water_batches)
    assert probes == len(waits)
    assert sum(s.high_water_batches == 3 for s in settings[50:]) / len(settings[50:]) > 0.9


def test_one_failed_probe_doubles_the_probe_wait_once() -> None:
    """A probe from mark 3 to 2 starves the trainer for mark + 1 steps before the raise that undoes it:
    the wait before the next probe is 16 steps after it, not doubled once per starving step."""
    policy = AdaptivePolicy(AdaptiveLimits(bound=8))

    def plant(s: AdmissionSetting) -> StepObservation:
        return NEVER_WAITS if s.high_water_batches >= 3 else STARVING

    _drive(policy, plant, 3)
    assert policy.setting == AdmissionSetting(8, 3) and policy.probe_steps == PROBE_STEPS
    _drive(policy, plant, PROBE_STEPS)
    assert policy.setting == AdmissionSetting(7, 2) and policy.last_reason == "surplus"
    _drive(policy, plant, 2)  # starving, the pipeline not yet refilled under mark 2: no raise yet
    assert policy.setting == AdmissionSetting(7, 2) and policy.probe_steps == PROBE_STEPS
    _drive(policy, plant, 1)
    assert policy.setting == AdmissionSetting(8, 3) and policy.last_reason == "starving"
    assert policy.probe_steps == 2 * PROBE_STEPS


@pytest.mark.parametrize("bound", [0, 1, 3])
def test_never_above_the_bound_whatever_is_observed(bound: int) -> None:
    policy = AdaptivePolicy(AdaptiveLimits(bound=bound))
    script = [STARVING, NEVER_WAITS, StepObservation(0.9, 1.0, None, 9.0, 0.5, 3, 2), STARVING] * 20
    it = iter(script)
    _check_bounds(_drive(policy, lambda s: next(it), len(script)), bound)


def test_state_dict_round_trip_and_a_lower_bound_on_resume() -> None:
    policy = AdaptivePolicy(AdaptiveLimits(bound=8))
    _drive(policy, lambda s: STARVING, 9)
    again = AdaptivePolicy(AdaptiveLimits(bound=8))
    again.load_state_dict(policy.state_dict())
    assert again.setting == policy.setting and again.state_dict() == policy.state_dict()
    assert again.update(STARVING) == policy.update(STARVING)
    lower = AdaptivePolicy(AdaptiveLimits(bound=2))
    lower.load_state_dict(policy.state_dict())
    assert lower.setting.max_staleness <= 2 and lower.setting.high_water_batches <= 3


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError):
        AdaptiveLimits(bound=-1)
    with pytest.raises(ValueError):
        AdaptiveLimits(bound=2, wait_target=0.0)
    with pytest.raises(ValueError):
        AdaptiveLimits(bound=2, weight_sq_limit=1.0)


def test_setting_means_average_the_chosen_setting_and_fall_back_to_the_fixed_one() -> None:
    lines = [{"adaptive_max_staleness": 2, "adaptive_high_water_batches": 3}, {"adaptive_max_staleness": 5}, {}]
    assert setting_means(lines, max_staleness=8, high_water_batches=1) == {"eta_mean": 5.0, "high_water_mean": 5 / 3}
    assert setting_means([], max_staleness=4, high_water_batches=2) == {"eta_mean": 4.0, "high_water_mean": 2.0}
