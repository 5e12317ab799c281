"""``asyncrl simulate`` with adaptive admission (``scenario.adaptive``): the simulator drives the real
``controller.adaptive`` policy on its step metrics; η_t and the mark change within the bound, every
trained group is within the η_t of its admission, and the result reports the means in force."""

from __future__ import annotations

from asyncrl.config import load_config
from asyncrl.sim.run import simulate
from asyncrl.sim.scenario import Scenario, from_config, with_overrides


def test_the_adaptive_policy_sets_admission_in_the_simulation_within_the_bound() -> None:
    scenario = with_overrides(Scenario(), ["adaptive=true", "max_staleness=6", "total_steps=60", "seed=1"])
    assert scenario.adaptive is True
    sim = simulate(scenario)
    metrics = sim.raw["metrics"]
    etas = [m["adaptive_max_staleness"] for m in metrics]
    marks = [m["adaptive_high_water_batches"] for m in metrics]
    assert len(set(etas)) > 1 and len(set(marks)) > 1  # it moved
    assert all(0 <= e <= 6 for e in etas) and all(1 <= k <= e + 1 for k, e in zip(marks, etas, strict=True))
    assert all(m["engine_slot_occupancy"] is None or 0 <= m["engine_slot_occupancy"] <= 1 for m in metrics)
    trained = [r for r in sim.raw["ledger"] if r["status"] == "trained"]
    assert trained and all(r["trained_step"] - r["min_version"] <= r["max_staleness"] <= 6 for r in trained)
    r = sim.result
    assert r.eta_mean == sum(etas) / len(etas) and r.high_water_mean == sum(marks) / len(marks)
    assert r.max_staleness_seen <= max(etas)


def test_a_fixed_setting_is_unchanged_and_reports_its_own_means() -> None:
    sim = simulate(Scenario(max_staleness=3, high_water_batches=2, total_steps=20))
    assert "adaptive_max_staleness" not in sim.raw["metrics"][0]
    assert all("max_staleness" not in r for r in sim.raw["ledger"])
    assert (sim.result.eta_mean, sim.result.high_water_mean) == (3.0, 2.0)


def test_a_configs_adaptive_reaches_the_scenario() -> None:
    cfg = load_config(None, ["controller.adaptive=true", "controller.max_staleness=8"])
    assert from_config(cfg).adaptive is True
    assert with_overrides(Scenario(), ["adaptive=false"]).adaptive is False
