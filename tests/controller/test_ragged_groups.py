"""Groups whose episodes yield several samples (``Group.episodes``, ``agent.episode_mode`` tree or individual):
the batcher gives each group the advantages of its own samples and normalises over the batch's real
samples only; the ledger records whose episode a sample is and the group's size, and the ledger check
expects that many samples of such a group (and still finds one missing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncrl.algo.advantages import compute_advantages
from asyncrl.config import AlgoConfig
from asyncrl.controller.buffer import groups_to_samples
from asyncrl.controller.ledger_checks import LedgerLimits, check_ledger
from asyncrl.types import Completion, Group, Prompt


def _group(pid: str, rewards: list[float], episodes: tuple[int, ...] = ()) -> Group:
    comps = tuple(Completion((1, 2), (3 + i, 4), (-0.5, -0.25), (0, 0), "stop") for i in range(len(rewards)))
    return Group(Prompt(pid, (1, 2)), comps, tuple(rewards), 0, episodes=episodes)


def test_each_group_has_its_own_samples_advantages() -> None:
    a = _group("a", [1.0, 0.0, 0.5], episodes=(0, 0, 1))
    b = _group("b", [0.0, 1.0, 1.0, 0.2, 0.9], episodes=(0, 1, 1, 1, 1))
    samples = groups_to_samples([a, b], AlgoConfig())
    assert [s.prompt_id for s in samples] == ["a"] * 3 + ["b"] * 5
    for group, got in ((a, samples[:3]), (b, samples[3:])):
        want = compute_advantages(torch.tensor([group.rewards], dtype=torch.float64), "grpo")[0]
        for s, w in zip(got, want.tolist(), strict=True):
            assert s.advantages[2:] == pytest.approx((w, w)) and s.advantages[:2] == (0.0, 0.0)
    normalized = groups_to_samples([a, b], AlgoConfig(batch_normalize=True))
    per_sample = torch.tensor([s.advantages[-1] for s in normalized])
    assert per_sample.mean().item() == pytest.approx(0.0, abs=1e-9)  # the padding is no sample
    assert per_sample.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-4)


def test_groups_of_several_sizes_need_episodes() -> None:
    with pytest.raises(ValueError, match="same size"):
        groups_to_samples([_group("a", [1.0, 0.0]), _group("b", [1.0, 0.0, 0.5])], AlgoConfig())
    with pytest.raises(ValueError, match="episodes"):
        _group("a", [1.0, 0.0], episodes=(0,))


def _admit(pid: str, index: int) -> dict[str, Any]:
    return {
        "prompt_id": pid,
        "sample_idx": None,
        "status": "admitted",
        "stream_index": index,
        "start_version": 0,
        "readmitted": False,
    }


def _trained(pid: str, step: int, n: int) -> list[dict[str, Any]]:
    return [
        {
            "prompt_id": pid,
            "sample_idx": i,
            "status": "trained",
            "min_version": 0,
            "max_version": 0,
            "trained_step": step,
            **_group(pid, [0.0] * n, (0,) * n).sample_fields(i),
        }
        for i in range(n)
    ]


def test_the_ledger_check_expects_each_groups_own_size(tmp_path: Path) -> None:
    limits = LedgerLimits(batch_size=2, group_size=2, max_staleness=1)
    ledger = [_admit("p0", 0), _admit("p1", 1), *_trained("p0", 0, 5), *_trained("p1", 0, 3)]
    run = tmp_path / "ok"
    run.mkdir()
    (run / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ledger))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0}) + "\n")
    assert check_ledger(run, limits, total_steps=1).require().trained == 8
    short = tmp_path / "short"
    short.mkdir()
    (short / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ledger[:-1]))  # one lost
    (short / "metrics.jsonl").write_text(json.dumps({"step": 0}) + "\n")
    problems = check_ledger(short, limits, total_steps=1).problems
    assert any("p1: samples [0, 1], expected [0, 1, 2]" in p for p in problems), problems
    assert any("step 0: 7 samples in the ledger, 8 expected" in p for p in problems), problems
