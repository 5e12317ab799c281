"""``python -m benchmarks prefix-reuse``: the scripted workload through the real engine, both arms, one seed."""

from __future__ import annotations

import json

from benchmarks.prefix_reuse import run_prefix_reuse_bench


def test_scripted_episodes_prefill_less_with_reuse_and_stay_identical(tmp_path, monkeypatch) -> None:
    """... and the random-init policy the scripted arms decode with is built in a scratch directory that the bench
    removes (the system temp directory redirected to ``tmp_path``: none of the bench's left there)."""
    import tempfile

    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch_root))
    out = tmp_path / "prefix_reuse.json"
    overrides = ("agent.max_turns=3", "agent.max_turn_tokens=6", "rollout.group_size=2")
    result = run_prefix_reuse_bench(str(out), overrides=overrides, seeds=(0,), num_prompts=2, workload="scripted")
    off, on = result["rows"]
    assert (off["prefix_reuse"], on["prefix_reuse"]) == (False, True)
    assert off["episodes"] == on["episodes"] == 4 and off["turns_per_episode"] == 3
    assert off["reused_tokens_per_episode"] == 0 and on["prefix_hits"] == 4 * 2  # turns 2 and 3
    total_off = off["prefill_tokens_per_episode"]
    assert on["prefill_tokens_per_episode"] + on["reused_tokens_per_episode"] == total_off
    (seed,) = result["per_seed"]
    assert seed["episodes_identical"] == 4 and 0 < seed["prefill_reduction"] < 1
    assert json.loads(out.read_text())["workload"]["name"] == "scripted"
    assert list(scratch_root.glob("asyncrl-prefix-reuse-*")) == []
