"""The records of types.py: the multi-turn trajectory flattened exactly, masks and versions."""

from __future__ import annotations

import pytest

from asyncrl.types import Completion, EnvSegment, Group, ModelSegment, Prompt, Trajectory


def _traj() -> Trajectory:
    return Trajectory(
        prompt_ids=(1, 2, 3),
        segments=(
            ModelSegment((10, 11), (-0.5, -0.25), (4, 5), "stop", num_interruptions=1),
            EnvSegment((20, 21, 22), "tool"),
            ModelSegment((12,), (-1.0,), (3,), "stop"),
        ),
        end="answer",
        env_reward=1.0,
    )


def test_trajectory_is_the_concatenation_of_its_segments() -> None:
    t = _traj()
    assert t.token_ids == (1, 2, 3, 10, 11, 20, 21, 22, 12)
    assert t.response_ids == (10, 11, 20, 21, 22, 12)
    assert t.loss_mask == (1, 1, 0, 0, 0, 1)
    assert t.behav_logprobs == (-0.5, -0.25, 0.0, 0.0, 0.0, -1.0)
    assert t.versions == (4, 5, -1, -1, -1, 3)
    assert (t.min_version, t.max_version) == (3, 5)  # staleness: the oldest model token


def test_to_completion_keeps_ids_mask_and_versions() -> None:
    c = _traj().to_completion()
    assert c.prompt_ids == (1, 2, 3) and c.output_ids == (10, 11, 20, 21, 22, 12)
    assert c.loss_mask == (1, 1, 0, 0, 0, 1) and c.output_mask == c.loss_mask
    assert (c.min_version, c.max_version) == (3, 5)  # environment tokens (-1) do not count
    assert c.num_interruptions == 1 and c.finish_reason == "stop"


def test_single_turn_completion_defaults_to_all_model_tokens() -> None:
    c = Completion((1,), (2, 3), (-0.1, -0.2), (0, 1), "stop")
    assert c.loss_mask == () and c.output_mask == (1, 1)
    assert (c.min_version, c.max_version) == (0, 1)


def test_completion_rejects_a_bad_mask() -> None:
    with pytest.raises(ValueError, match="loss_mask"):
        Completion((1,), (2, 3), (-0.1, -0.2), (0, 1), "stop", loss_mask=(1,))
    with pytest.raises(ValueError, match="loss_mask"):
        Completion((1,), (2, 3), (-0.1, -0.2), (0, 1), "stop", loss_mask=(1, 2))


def test_segments_and_group_check_their_lengths() -> None:
    with pytest.raises(ValueError):
        ModelSegment((1, 2), (-0.1,), (0, 0), "stop")
    t = _traj()
    with pytest.raises(ValueError, match="trajectories"):
        Group(Prompt("p", (1, 2, 3)), (t.to_completion(),), (1.0,), 0, trajectories=(t, t))
    g = Group(Prompt("p", (1, 2, 3)), (t.to_completion(),), (1.0,), 0, trajectories=(t,))
    assert (g.min_version, g.max_version) == (3, 5)
