"""The tinker-loop benchmark's own arithmetic: GRPO advantages of a group, and the weight-update measure."""

from __future__ import annotations

import pytest

from benchmarks.tinker_loop import _advantages, measure_updates


def test_grpo_advantages_of_a_group_and_equal_rewards_dropped() -> None:
    adv = _advantages([1.0, 0.0, 0.0, 1.0])
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    assert _advantages([1.0, 1.0, 1.0]) is None


def test_a_lora_update_trains_fewer_bytes_and_both_reach_the_engine(tiny_policy_dir) -> None:
    pytest.importorskip("peft")
    out = measure_updates(tiny_policy_dir, rank=4, repeats=1)
    assert 0 < out["lora_trained_bytes"] < out["full_trained_bytes"]
    assert out["lora_update_bytes"] == out["lora_trained_bytes"] < out["full_update_bytes"]  # the adapters alone
    assert out["adapter_over_full_bytes"] == pytest.approx(out["lora_update_bytes"] / out["full_update_bytes"])
    assert out["lora_update_s"] > 0 and out["full_update_s"] > 0
