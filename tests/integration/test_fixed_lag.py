"""Controlled staleness end to end (``controller.fixed_lag``), read back from the ledger: every
sample trained at step i was generated entirely by version max(0, i - k); k = 0 trains the same
prompts at the same steps as ordinary synchronous training (max_staleness = 0)."""

from __future__ import annotations

from collections import defaultdict

import pytest

from asyncrl.controller.rundir import read_jsonl
from asyncrl.launch.local import train
from tests.integration.test_loop import _cfg


def _trained(run_dir) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "trajectories.jsonl") if r["status"] == "trained"]


def _prompts_by_step(rows: list[dict]) -> dict[int, set[str]]:
    out: dict[int, set[str]] = defaultdict(set)
    for r in rows:
        out[r["trained_step"]].add(r["prompt_id"])
    return dict(out)


@pytest.mark.parametrize(("lag", "trainer_process"), [(2, True), (0, False)])
def test_every_trained_sample_has_exactly_the_lag(tiny_policy_dir, tmp_path, lag: int, trainer_process: bool) -> None:
    run_dir = tmp_path / f"lag{lag}"
    extra = [f"controller.fixed_lag={lag}"]
    _, summary = train(_cfg(tiny_policy_dir, run_dir, 2, steps=5, trainer_process=trainer_process, extra=extra))
    trained = _trained(run_dir)
    assert len(trained) == 5 * 4 * 4
    for r in trained:
        want = max(0, r["trained_step"] - lag)
        assert r["min_version"] == r["max_version"] == want, r
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert sum(m["generated_tokens_during_train"] for m in metrics) == 0  # synchronous admission
    assert summary["accuracy_after"] is not None
    assert summary["max_staleness_seen"] == (lag if lag else 0)
    if lag == 0:  # the same prompts at the same steps as ordinary synchronous training
        sync_dir = tmp_path / "sync"
        train(_cfg(tiny_policy_dir, sync_dir, 0, steps=5, trainer_process=False))
        sync = _trained(sync_dir)
        assert all(r["min_version"] == r["max_version"] == r["trained_step"] for r in sync)
        assert _prompts_by_step(sync) == _prompts_by_step(trained)
