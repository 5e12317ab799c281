"""``python -m benchmarks train`` (``benchmarks.train``): structure of the rows and ratios on a small run."""

from __future__ import annotations

import json

from benchmarks.train import bench_samples, run_train_bench


def test_bench_samples_are_long_tailed() -> None:
    samples = bench_samples(200, seed=1)
    lengths = sorted(sum(s.loss_mask) for s in samples)
    assert lengths[100] <= 40 and lengths[-1] >= 128  # many short answers, a few very long ones
    assert all(s.loss_mask[0] == 0 and len(s.token_ids) == len(s.behav_logprobs) for s in samples)


def test_bench_train_rows_and_ratios(tmp_path) -> None:
    out = tmp_path / "bench.json"
    result = run_train_bench(out, models=("tiny",), samples=12, budget=512, padded_sizes=(2,), steps=1)
    assert json.loads(out.read_text())["ratios"] == result["ratios"]
    rows = result["rows"]
    packed = [r for r in rows if r["micro_batching"] == "packed"]
    padded = [r for r in rows if r["micro_batching"] == "padded"]
    assert len(packed) == 1 and {r["padded_micro_batch_size"] for r in padded} >= {2}
    assert packed[0]["computed_tokens"] == packed[0]["trained_tokens"] and packed[0]["padding_frac"] == 0.0
    assert all(r["computed_tokens"] > r["trained_tokens"] for r in padded if r["padded_micro_batch_size"] > 1)
    assert sum(r["same_budget"] for r in padded) == 1
    for r in rows:
        assert r["trained_tokens_per_s"] > 0 and r["step_time_s"] > 0
    grouped = [r for r in rows if r["micro_batching"] == "padded_grouped"]
    assert {r["padded_micro_batch_size"] for r in grouped} == {r["padded_micro_batch_size"] for r in padded}
    assert not any(r["same_budget"] for r in grouped)
    for g in grouped:  # sorted buckets never pad more than batch order at the same size
        p = next(r for r in padded if r["padded_micro_batch_size"] == g["padded_micro_batch_size"])
        assert g["computed_tokens"] <= p["computed_tokens"] and g["trained_tokens"] == p["trained_tokens"]
    assert set(result["ratios"]) == {
        "tiny_packed_vs_padded_same_budget",
        "tiny_packed_vs_best_padded",
        "tiny_packed_vs_best_padded_grouped",
        "tiny_best_padded_grouped_size",
    }
