"""bench decode (small sizes): every (context, running) pair measured on the same engine, JSON shape."""

from __future__ import annotations

import json

import pytest

from benchmarks.decode import run_decode_sweep


def test_decode_sweep_measures_each_pair(tiny_dir, tmp_path):
    out = tmp_path / "decode.json"
    res = run_decode_sweep(
        str(out), model_dir=str(tiny_dir), contexts=(8, 40), running=(1, 3), new_tokens=6, print_table=False
    )
    assert json.loads(out.read_text()) == res
    assert [(r["context"], r["running"]) for r in res["rows"]] == [(8, 1), (8, 3), (40, 1), (40, 3)]
    for r in res["rows"]:
        assert r["generated_tokens"] == r["running"] * 6  # no stop token: every sample runs its budget
        assert r["decode_tokens"] == r["running"] * 5  # the first token of each comes from the prefill
        assert r["decode_s"] > 0 and r["decode_tokens_per_s"] == pytest.approx(r["decode_tokens"] / r["decode_s"])
    assert set(res["table"]) == {"8-14", "40-46"} and set(res["table"]["8-14"]) == {"1", "3"}


def test_decode_sweep_rejects_empty_or_bad_sizes(tiny_dir):
    with pytest.raises(ValueError):
        run_decode_sweep(None, model_dir=str(tiny_dir), contexts=(), print_table=False)
    with pytest.raises(ValueError):
        run_decode_sweep(None, model_dir=str(tiny_dir), running=(0,), print_table=False)
