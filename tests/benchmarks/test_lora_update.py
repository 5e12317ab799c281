"""The lora-update benchmark's measure on the tiny policy: what it ships and that samples in flight keep
their version (the timings themselves are the benchmark's, not asserted here)."""

from __future__ import annotations

import pytest

from benchmarks.lora_update import measure_model


def test_an_adapter_update_ships_the_adapters_alone_and_in_flight_samples_keep_their_version(tiny_policy_dir) -> None:
    pytest.importorskip("peft")
    row = measure_model(tiny_policy_dir, rank=4, repeats=1, slots=2, tokens=12)
    idle, flight, decode = row["idle"], row["in_flight"], row["decode"]
    assert 0 < idle["adapter_update_bytes"] < idle["full_update_bytes"]
    assert idle["full_update_bytes"] >= 4 * row["parameters"]  # fp32, every parameter (a tied head's copy too)
    assert idle["adapter_over_full_bytes"] == pytest.approx(idle["adapter_update_bytes"] / idle["full_update_bytes"])
    assert flight["adapter_in_flight_kept_version"] and flight["full_in_flight_kept_version"]
    assert all(decode[f"{arm}_tokens_per_s"] > 0 for arm in ("base", "one_adapter", "two_adapters"))
