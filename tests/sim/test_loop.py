"""The simulated loop: the staleness bound as an invariant, η = 0 is synchronous, more engines help a
generation-bound run, a hand-computed run, and the lazy (group-level) engine events agree with the
sample-by-sample ones."""

from __future__ import annotations

from dataclasses import replace

import pytest

from asyncrl.controller.buffer import GroupBuffer
from asyncrl.controller.staleness import StalenessGate
from asyncrl.sim.loop import Simulator
from asyncrl.sim.profile import CostProfile, EngineCost, RewardCost, SyncCost, TrainerCost
from asyncrl.sim.run import simulate
from asyncrl.sim.scenario import Scenario


def profile(decode: float = 0.002, per_token: float = 2e-4, **kw: float | bool) -> CostProfile:
    engine = {
        "decode_base_s": decode,
        "decode_per_seq_s": 5e-5,
        "decode_per_ctx_token_s": 2e-7,
        "prefill_per_token_s": 5e-5,
        "update_s": 0.002,
        **kw,
    }
    return CostProfile(
        "test", "none", "none", EngineCost(**engine), TrainerCost(0.05, per_token), SyncCost(0.02), RewardCost(0.01)
    )


SMALL = Scenario(
    batch_size=4,
    group_size=4,
    max_concurrent=32,
    total_steps=12,
    length_median=60,
    prompt_len=20,
    max_new_tokens=512,
    slots=32,
)


@pytest.mark.parametrize("eta", [0, 1, 2, 4])
@pytest.mark.parametrize("mode", ["abort", "keep"])
@pytest.mark.parametrize("unit,mark,engines", [("groups", 2, 1), ("samples", 2, 1), ("groups", 0, 3)])
@pytest.mark.parametrize("layout", [False, True])
def test_staleness_never_exceeds_eta(eta: int, mode: str, unit: str, mark: int, engines: int, layout: bool) -> None:
    sc = replace(
        SMALL,
        max_staleness=eta,
        interrupt_mode=mode,
        high_water_unit=unit,
        high_water_batches=mark,
        engines=engines,
        seed=eta,
    )
    sim = simulate(sc, profile(slot_prefix_rows=layout))
    r = sim.result
    assert r.steps == sc.total_steps
    assert r.max_staleness_seen <= eta
    trained = [row for row in sim.raw["ledger"] if row["status"] == "trained"]
    assert len(trained) == sc.total_steps * sc.batch_size * sc.group_size
    assert all(row["trained_step"] - row["min_version"] <= eta for row in trained)
    g = r.groups
    assert g["trained"] + g["filtered"] + g["stale"] + g["unused"] + g["in_flight"] == g["admitted"]
    sim_engines = Simulator(sc, profile(slot_prefix_rows=layout))
    sim_engines.run()
    assert sim_engines.totals.running == sum(len(e.run) for e in sim_engines.engines)
    assert sim_engines.totals.waiting == sum(len(e.waiting) for e in sim_engines.engines)


def test_eta_zero_is_synchronous() -> None:
    sim = simulate(replace(SMALL, max_staleness=0, total_steps=10), profile())
    assert sim.result.staleness_hist == {0: 40}
    timeline = sim.raw["timeline"]
    assert sum(s["trainer_busy"] for s in timeline) > 5
    for prev, cur in zip(timeline, timeline[1:], strict=False):
        if prev["trainer_busy"] and cur["trainer_busy"] and prev["version"] == cur["version"]:  # one step: nothing
            # generated while it trains
            assert cur["engine_generated_tokens"] == prev["engine_generated_tokens"]
        if cur["trainer_busy"]:
            assert cur["engine_running"] == 0 and cur["running_groups"] == 0
    assert sim.result.interruptions_per_sample == 0  # the weights never change under a running sample


def test_more_engines_raise_a_generation_bound_throughput() -> None:
    slow_engine = profile(decode=0.02, per_token=1e-6)
    sc = replace(
        SMALL,
        max_staleness=4,
        batch_size=8,
        max_concurrent=64,
        high_water_batches=0,
        total_steps=16,
        lengths="constant",
    )
    rates = [simulate(replace(sc, engines=n), slow_engine).result.steady_state_tokens_per_s for n in (1, 2, 4)]
    assert rates[0] < rates[1] < rates[2]
    assert rates[2] > 3.0 * rates[0]  # each engine's step costs about the same, whatever its batch
    tailed = replace(sc, lengths="lognormal", max_staleness=2)
    rates = [simulate(replace(tailed, engines=n), slow_engine).result.steady_state_tokens_per_s for n in (1, 2, 4)]
    assert rates[0] < rates[1] < rates[2]


def test_a_hand_computed_run() -> None:
    """η = 0, one engine, constant lengths and costs: every step is prefill + (L - 1) decode steps +
    reward + training + export + engine load, computed by hand."""
    a, p, u, x, r, base, tau = 0.01, 0.001, 0.05, 0.1, 0.2, 0.5, 0.001
    prof = CostProfile(
        "hand", "none", "none", EngineCost(a, 0.0, 0.0, p, u), TrainerCost(base, tau), SyncCost(x), RewardCost(r)
    )
    b, g, plen, length, steps = 2, 4, 10, 50, 6
    sc = Scenario(
        batch_size=b,
        group_size=g,
        max_staleness=0,
        max_concurrent=8,
        high_water_batches=0,
        total_steps=steps,
        lengths="constant",
        length_median=length,
        prompt_len=plen,
        slots=8,
    )
    sim = simulate(sc, prof)
    tokens = b * g * (plen + length)
    step_s = b * plen * p + (length - 1) * a + r + base + tau * tokens + x + u
    res = sim.result
    assert res.sim_time_s == pytest.approx(steps * step_s)
    assert res.whole_run_tokens_per_s == pytest.approx(tokens / step_s)
    assert [m["time_s"] for m in sim.raw["metrics"]] == pytest.approx([(i + 1) * step_s for i in range(steps)])
    assert res.trainer_busy_frac == pytest.approx((base + tau * tokens + x + u) / step_s)
    assert res.slot_utilisation == pytest.approx(b * g / 8)
    # the steady-state window counts generation: the last batch's first tokens were sampled at the end
    assert res.steady_state_tokens_per_s == pytest.approx(tokens / step_s, rel=0.01)


def test_a_trainer_bound_run_steps_at_the_trainer_speed() -> None:
    prof = profile(decode=1e-4, per_token=2e-3)
    sc = replace(SMALL, max_staleness=4, high_water_batches=0, lengths="constant", total_steps=15)
    sim = simulate(sc, prof)
    tokens = sc.batch_size * sc.group_size * (sc.prompt_len + 60)
    step_s = prof.trainer.step_s(tokens) + prof.sync.export_s + prof.engine.update_s
    late = [m["trained_tokens_per_s_step"] for m in sim.raw["metrics"][5:]]
    assert late == pytest.approx([tokens / step_s] * len(late), rel=1e-6)


@pytest.mark.parametrize("mode", ["abort", "keep"])
@pytest.mark.parametrize("layout", [False, True])
def test_group_level_events_agree_with_sample_level_ones(mode: str, layout: bool) -> None:
    """With the gate counting groups, whether the controller hears of every sample changes nothing
    but the number of events: the lazily committed engines give the same run (with the slot layout's
    costs too: its plans hide and show the slots of the samples they end)."""
    sc = replace(
        SMALL,
        engines=4,
        high_water_unit="groups",
        high_water_batches=3,
        interrupt_mode=mode,
        total_steps=15,
        max_staleness=3,
    )
    lazy = simulate(replace(sc, sample_reports="no"), profile(slot_prefix_rows=layout))
    eager = simulate(replace(sc, sample_reports="yes"), profile(slot_prefix_rows=layout))
    assert lazy.result.events < eager.result.events
    for key in ("trained_tokens", "staleness_hist", "groups", "prefill_tokens"):
        assert getattr(lazy.result, key) == getattr(eager.result, key)
    assert lazy.result.sim_time_s == pytest.approx(eager.result.sim_time_s, rel=1e-9)
    assert lazy.result.generated_tokens == eager.result.generated_tokens


def test_it_drives_the_controllers_own_gate_and_buffer() -> None:
    sim = Simulator(SMALL, profile())
    assert type(sim.gate) is StalenessGate and type(sim.buffer) is GroupBuffer


def test_filtered_groups_cost_generation_and_train_nothing() -> None:
    sim = simulate(replace(SMALL, filter_prob=0.4), profile())
    g = sim.result.groups
    assert g["filtered"] > 0 and g["trained"] == SMALL.total_steps * SMALL.batch_size
    filtered = [row for row in sim.raw["ledger"] if row["status"] == "filtered"]
    assert filtered and all(row["trained_step"] is None for row in filtered)


def test_drain_waits_for_running_groups_before_an_update() -> None:
    sim = simulate(replace(SMALL, weight_sync="drain", max_staleness=4, interrupt_mode="abort"), profile())
    assert sim.result.interruptions_per_sample == 0
    assert sim.result.max_staleness_seen <= 4


def test_abort_re_prefills_and_keep_does_not() -> None:
    sc = replace(SMALL, max_staleness=4, high_water_batches=0, length_median=300, total_steps=10)
    keep = simulate(replace(sc, interrupt_mode="keep"), profile()).result
    abort = simulate(replace(sc, interrupt_mode="abort"), profile()).result
    assert keep.interruptions_per_sample > 0 and abort.interruptions_per_sample > 0
    assert abort.prefill_tokens > keep.prefill_tokens


def test_a_run_is_deterministic_for_a_seed() -> None:
    sc = replace(SMALL, engines=3, max_staleness=2)
    first, second = simulate(sc, profile()).result, simulate(sc, profile()).result
    clock = {"wall_s": 0, "cpu_s": 0, "events_per_s": 0}
    assert first.as_row() | clock == second.as_row() | clock


def test_waiting_for_stragglers_trains_every_group_within_eta() -> None:
    """Long-tailed runs at η = 1, 2, 4 drop groups finished past their bound (``drop``); ``wait`` holds the
    trainer for them instead: nothing dropped, nothing trained past η, every step taken."""
    for eta, seed in ((1, 3), (4, 2), (2, 0), (4, 5)):
        sc = replace(SMALL, max_staleness=eta, lengths="lognormal", high_water_batches=0, total_steps=16, seed=seed)
        dropped, waited = (simulate(replace(sc, stragglers=p), profile()).result for p in ("drop", "wait"))
        assert dropped.groups["stale"] > 0, (eta, seed)
        assert waited.groups["stale"] == 0 and waited.max_staleness_seen <= eta and waited.steps == sc.total_steps
