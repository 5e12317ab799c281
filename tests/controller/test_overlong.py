"""DAPO's overlong penalty reaches the advantages from the config (``algo.overlong_buffer``)."""

from __future__ import annotations

import pytest
import torch

from asyncrl.algo.advantages import grpo_advantages
from asyncrl.config import AlgoConfig, ConfigError, load_config
from asyncrl.controller.buffer import groups_to_samples
from asyncrl.types import Completion, Group, Prompt


def _group(lengths: list[int], rewards: list[float]) -> Group:
    comps = tuple(
        Completion((1, 2), tuple([5] * n), tuple([-1.0] * n), tuple([0] * n), "length" if n >= 20 else "stop")
        for n in lengths
    )
    return Group(Prompt("p", (1, 2)), comps, tuple(rewards), start_version=0)


def test_overlong_penalty_shapes_the_advantages() -> None:
    # budget 20, buffer 8: lengths 10 (no penalty), 16 (-0.5 * 4/8), 20 (-0.5)
    group = _group([10, 16, 20, 12], [1.0, 1.0, 0.0, 0.0])
    off = groups_to_samples([group], AlgoConfig(), max_new_tokens=20)
    on = groups_to_samples([group], AlgoConfig(overlong_buffer=8, overlong_penalty=0.5), max_new_tokens=20)
    shaped = torch.tensor([[1.0, 1.0 - 0.25, 0.0 - 0.5, 0.0]], dtype=torch.float64)
    want = grpo_advantages(shaped)[0].tolist()
    assert [s.advantages[-1] for s in on] == pytest.approx(want, rel=1e-12)
    assert [s.advantages[-1] for s in off] == pytest.approx(grpo_advantages(torch.tensor([[1.0, 1, 0, 0]]))[0].tolist())
    assert [s.reward for s in on] == [1.0, 1.0, 0.0, 0.0]  # the ledger keeps the verifier's reward
    with pytest.raises(ValueError, match="max_new_tokens"):
        groups_to_samples([group], AlgoConfig(overlong_buffer=8))


def test_overlong_config_is_validated() -> None:
    assert load_config(None, ["algo.overlong_buffer=32"]).algo.overlong_buffer == 32
    with pytest.raises(ConfigError, match="algo.overlong_buffer"):
        load_config(None, ["algo.overlong_buffer=1000"])  # past rollout.max_new_tokens=160
