"""Cost profiles: the schema round-trips, bad profiles are refused, the shipped ones load and cite."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from asyncrl.sim.profile import (
    SOURCE_KINDS,
    CostProfile,
    EngineCost,
    RewardCost,
    Source,
    SyncCost,
    TrainerCost,
    builtin_profiles,
    load_profile,
    save_profile,
)


def make_profile(**engine: float) -> CostProfile:
    costs = {
        "decode_base_s": 0.01,
        "decode_per_seq_s": 0.001,
        "decode_per_ctx_token_s": 1e-6,
        "prefill_per_token_s": 0.002,
        "update_s": 0.05,
        **engine,
    }
    return CostProfile(
        name="test",
        hardware="none",
        model="none",
        engine=EngineCost(**costs),
        trainer=TrainerCost(0.5, 0.001),
        sync=SyncCost(0.1),
        reward=RewardCost(0.2),
        sources=(Source("engine.*", "assumption", "a test"),),
    )


def test_profile_round_trips_through_json(tmp_path: Path) -> None:
    profile = make_profile()
    path = save_profile(profile, tmp_path / "p.json")
    assert load_profile(path) == profile
    assert CostProfile.from_dict(json.loads(path.read_text())) == profile


def test_cost_functions() -> None:
    p = make_profile()
    assert p.engine.step_s(4, 100) == pytest.approx(0.01 + 0.004 + 1e-4)
    assert p.trainer.step_s(1000) == pytest.approx(1.5)
    assert p.trainer.step_s(1000, ranks=4) == pytest.approx(0.5 + 0.25)  # efficiency 1
    assert replace(p.trainer, parallel_efficiency=0.5).step_s(1000, ranks=4) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "change",
    [
        {"decode_base_s": -1.0},
        {"decode_base_s": 0.0, "decode_per_seq_s": 0.0, "decode_per_ctx_token_s": 0.0},
        {"max_slots": 0},
        {"kv_capacity_tokens": -1},
    ],
)
def test_bad_engine_costs_are_refused(change: dict) -> None:
    with pytest.raises(ValueError):
        make_profile(**change)


def test_unknown_keys_and_source_kinds_are_refused() -> None:
    data = make_profile().to_dict()
    with pytest.raises(ValueError, match="unknown keys"):
        CostProfile.from_dict({**data, "speed": 1})
    with pytest.raises(ValueError, match="unknown keys"):
        CostProfile.from_dict({**data, "engine": {**data["engine"], "warp": 9}})
    with pytest.raises(ValueError, match="source kind"):
        CostProfile.from_dict({**data, "sources": [{"fields": "x", "kind": "rumour", "source": "y"}]})
    with pytest.raises(FileNotFoundError, match="no cost profile"):
        load_profile("no-such-profile")


@pytest.mark.parametrize("name", builtin_profiles())
def test_shipped_profiles_load_and_cite_every_section(name: str) -> None:
    p = load_profile(name)
    assert p.name == name
    cited = " ".join(s.fields for s in p.sources)
    for key in ("engine.decode_", "engine.prefill_per_token_s", "trainer.per_token_s", "reward.latency_s"):
        assert key in cited, f"{name}: no source for {key}"
    assert all(s.kind in SOURCE_KINDS and s.source for s in p.sources)


def test_the_shipped_profiles_include_this_machine_and_gpus() -> None:
    assert {"cpu-2core-tiny", "h800-1.5b", "h800-7b"} <= set(builtin_profiles())
    gpu = load_profile("h800-7b")
    assert any(s.kind == "assumption" for s in gpu.sources)  # the file says which numbers are assumed
