"""bench engine (small sizes): JSON shape, same workload on both sides, abort-vs-keep accounting."""

from __future__ import annotations

import json
import random

from benchmarks.engine import long_tailed_lengths, run_engine_bench, run_interrupt_cost


def test_long_tailed_lengths_are_mostly_short_with_a_long_tail():
    lengths = long_tailed_lengths(4000, random.Random(0))
    short = sum(1 for n in lengths if n <= 32) / len(lengths)
    long = sum(1 for n in lengths if n >= 128) / len(lengths)
    assert 0.65 < short < 0.75 and 0.03 < long < 0.07 and max(lengths) <= 256


def test_engine_bench_writes_rows_and_ratios(tiny_dir, tmp_path):
    out = tmp_path / "bench.json"
    res = run_engine_bench(str(out), model_dir=str(tiny_dir), num_requests=24, slots=8, print_table=False)
    assert json.loads(out.read_text()) == res
    local, hf = res["rows"]
    assert local["engine"] == "LocalEngine" and hf["engine"] == "transformers_generate"
    assert local["useful_tokens"] == hf["useful_tokens"] > 0
    for row in (local, hf):
        assert 0 < row["slot_utilisation"] <= 1
        assert abs(row["slot_utilisation"] - row["useful_tokens"] / (8 * row["decode_steps"])) < 1e-3
    assert res["ratios"]["useful_tokens_per_s"] == round(local["useful_tokens_per_s"] / hf["useful_tokens_per_s"], 2)
    assert local["decode_steps"] < hf["decode_steps"]  # continuous batching needs fewer steps


def test_interrupt_cost_accounts_reprefill_and_stale_kv(tiny_dir):
    res = run_interrupt_cost(
        model_dir=str(tiny_dir),
        num_prompts=8,
        group_size=2,
        slots=8,
        update_every_steps=6,
        check_samples=4,
        print_table=False,
    )
    rows = {r["mode"]: r for r in res["rows"]}
    assert rows["none"]["weight_updates"] == 0 and rows["none"]["reprefill_tokens"] == 0
    assert rows["abort"]["weight_updates"] > 0 and rows["abort"]["reprefill_tokens"] > 0
    assert rows["abort"]["stale_kv_tokens"] == 0 and rows["abort"]["logprob_gap_max"] < 1e-4
    assert rows["keep"]["reprefill_tokens"] == 0 and rows["keep"]["stale_kv_tokens"] > 0
    assert rows["keep"]["logprob_gap_mean"] > 1e-4
    assert rows["none"]["useful_tokens"] == rows["abort"]["useful_tokens"] == rows["keep"]["useful_tokens"]
