"""Scenarios (overrides, a config, a run directory) and the response-length models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.config import dump_yaml, load_config
from asyncrl.sim.scenario import Scenario, from_config, from_run, load_scenario, with_overrides
from asyncrl.sim.workload import LengthSampler, ledger_groups


def test_overrides_are_typed_and_checked(tmp_path: Path) -> None:
    s = with_overrides(Scenario(), ["max_staleness=8", "filter_prob=0.25", "interrupt_mode=keep"])
    assert (s.max_staleness, s.filter_prob, s.interrupt_mode) == (8, 0.25, "keep")
    with pytest.raises(ValueError, match="unknown scenario key 'eta'"):
        with_overrides(Scenario(), ["eta=3"])
    with pytest.raises(ValueError, match="interrupt_mode"):
        with_overrides(Scenario(), ["interrupt_mode=pause"])
    with pytest.raises(ValueError, match="lengths=ledger needs"):
        Scenario(lengths="ledger")
    path = tmp_path / "s.yaml"
    path.write_text("gpus: 512\nprofile: h800-7b\n")
    assert load_scenario(path, ["batch_size=512"]).gpus == 512


def test_a_device_budget_is_split_by_the_inference_fraction() -> None:
    s = Scenario(gpus=512, inference_fraction=0.75).resolved(engine_devices=2, rank_devices=1, profile_slots=64)
    assert (s.engines, s.trainer_ranks, s.slots) == (192, 128, 64)
    kept = Scenario(engines=3, slots=16).resolved(1, 1, 64)
    assert (kept.engines, kept.slots) == (3, 16)


def test_a_training_config_maps_onto_the_scenario() -> None:
    cfg = load_config(
        None,
        [
            "controller.max_staleness=2",
            "controller.high_water_unit=samples",
            "rollout.interrupt_mode=keep",
            "rollout.max_slots=32",
            "controller.total_steps=7",
        ],
    )
    s = from_config(cfg, profile="h800-1.5b")
    assert (s.max_staleness, s.high_water_unit, s.interrupt_mode, s.slots, s.total_steps, s.profile) == (
        2,
        "samples",
        "keep",
        32,
        7,
        "h800-1.5b",
    )


def _write_run(run: Path, *extra: str) -> None:
    run.mkdir()
    cfg = load_config(None, ["controller.batch_size=2", "rollout.group_size=2", "controller.max_staleness=3", *extra])
    dump_yaml(cfg, run / "config.yaml")
    rows = [
        {"prompt_id": "a", "sample_idx": 0, "status": "trained", "start_version": 0, "response_len": 10},
        {"prompt_id": "a", "sample_idx": 1, "status": "trained", "start_version": 0, "response_len": 30},
        {"prompt_id": "b", "sample_idx": 0, "status": "filtered", "start_version": 0, "response_len": 5},
        {"prompt_id": "b", "sample_idx": 1, "status": "filtered", "start_version": 0, "response_len": 7},
        {"prompt_id": "c", "sample_idx": None, "status": "admitted", "start_version": 1},
    ]
    (run / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "trained_tokens": 40 + 2 * 12, "applied": True}) + "\n")


def test_a_run_directory_gives_its_scenario(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _write_run(run)
    assert sorted(map(sorted, ledger_groups(run))) == [[5, 7], [10, 30]]
    s = from_run(run, profile="cpu-2core-tiny")
    assert (s.batch_size, s.group_size, s.max_staleness, s.lengths) == (2, 2, 3, "ledger")
    assert s.filter_prob == pytest.approx(0.5) and s.prompt_len == 12
    sampler = LengthSampler("ledger", 2, 100, ledger=s.ledger, seed=1)
    assert {tuple(sorted(sampler.next_group())) for _ in range(50)} == {(5, 7), (10, 30)}
    assert s.total_steps == 120  # the config's steps (its one metrics line says nothing without a budget)


def test_a_run_its_time_budget_ended_is_simulated_for_the_steps_it_trained(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _write_run(run, "controller.total_steps=200", "controller.max_rl_time_s=60")
    assert from_run(run, profile="cpu-2core-tiny").total_steps == 1  # one metrics line: one step trained


def test_lognormal_lengths_are_long_tailed_clipped_and_correlated_in_a_group() -> None:
    sampler = LengthSampler("lognormal", 8, 4000, median=300, sigma=1.0, within_sigma=0.2, seed=0)
    groups = [sampler.next_group() for _ in range(3000)]
    flat = sorted(x for g in groups for x in g)
    assert 1 <= flat[0] and flat[-1] <= 4000
    assert flat[len(flat) // 2] == pytest.approx(300, rel=0.1)
    assert sum(flat) / len(flat) > 1.4 * flat[len(flat) // 2]  # mean well above the median: a long tail
    spread_within = sum(max(g) / min(g) for g in groups) / len(groups)
    assert spread_within < 2.5  # samples of one prompt stay close (within_sigma), prompts differ a lot
    assert LengthSampler("constant", 4, 100, median=250).next_group() == [100] * 4  # clipped to the budget


def test_a_multi_turn_ledger_replays_its_model_tokens(tmp_path: Path) -> None:
    """A multi-turn line's response_len also holds the environment's (prefilled) tokens: the replayed
    decode length is its model_tokens."""
    rows = [
        {
            "prompt_id": "a",
            "sample_idx": i,
            "status": "trained",
            "start_version": 0,
            "response_len": 40,
            "model_tokens": 29 + i,
            "env_tokens": 11 - i,
        }
        for i in range(2)
    ]
    (tmp_path / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert ledger_groups(tmp_path) == [[29, 30]]


def _write_ordered_ledger(path: Path) -> None:
    """Four groups admitted d, b, a, c (``stream_index``), finished in another order; b and c filtered."""
    rows = [
        {"prompt_id": p, "sample_idx": None, "status": "admitted", "stream_index": i, "start_version": 0}
        for i, p in enumerate("dbac")
    ]
    fates = (("a", 3, "trained"), ("b", 40, "filtered"), ("c", 50, "filtered"), ("d", 6, "trained"))
    for prompt, length, status in fates:
        rows += [
            {"prompt_id": prompt, "sample_idx": i, "status": status, "start_version": 0, "response_len": length + i}
            for i in range(2)
        ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_replayed_group_keeps_its_fate_and_the_runs_order(tmp_path: Path) -> None:
    ledger = tmp_path / "trajectories.jsonl"
    _write_ordered_ledger(ledger)
    sampler = LengthSampler("ledger", 2, 100, ledger=ledger, ordered=True, seed=0)
    replayed = [(sampler.next_group(), sampler.replayed_filtered) for _ in range(4)]
    assert replayed == [([6, 7], False), ([40, 41], True), ([3, 4], False), ([50, 51], True)]
    drawn = [(tuple(sampler.next_group()), sampler.replayed_filtered) for _ in range(200)]  # then drawn
    assert set(drawn) == {((6, 7), False), ((40, 41), True), ((3, 4), False), ((50, 51), True)}
    unordered = LengthSampler("ledger", 2, 100, ledger=ledger, seed=0)
    firsts = {tuple(LengthSampler("ledger", 2, 100, ledger=ledger, seed=s).next_group()) for s in range(20)}
    assert len(firsts) > 1 and unordered.replayed_filtered is None  # draws from the first group on


def test_the_filter_replays_the_ledgers_verdicts(tmp_path: Path) -> None:
    """With ``ledger_filter`` the long groups that the run filtered are filtered again (a coin at the
    same rate would train them half the time)."""
    from asyncrl.sim.run import simulate

    ledger = tmp_path / "trajectories.jsonl"
    _write_ordered_ledger(ledger)
    base = Scenario(
        profile="cpu-2core-tiny",
        lengths="ledger",
        ledger=str(ledger),
        batch_size=2,
        group_size=2,
        max_concurrent=4,
        max_staleness=1,
        total_steps=20,
        prompt_len=5,
        max_new_tokens=100,
    )
    replayed = simulate(with_overrides(base, ["ledger_filter=true"]))
    trained = replayed.result.trained_tokens / (20 * 2 * 2)  # per trained sample: prompt + response
    assert trained < 5 + 10  # only the short groups (3-7 tokens) are trained
    coin = simulate(with_overrides(base, ["filter_prob=0.5"]))
    assert coin.result.trained_tokens / (20 * 2 * 2) > trained + 5
    with pytest.raises(ValueError, match="need lengths=ledger"):
        Scenario(ledger_filter=True)
