"""The group buffer's staleness check and the group -> sample conversion."""

from __future__ import annotations

import pytest

from asyncrl.config import AlgoConfig
from asyncrl.controller.buffer import GroupBuffer, groups_to_samples
from asyncrl.types import Completion, Group, Prompt


def _group(pid: str, rewards: list[float], versions: list[int]) -> Group:
    comps = tuple(
        Completion(
            prompt_ids=(1, 2),
            output_ids=(3, 4, 5),
            behav_logprobs=(-0.1, -0.2, -0.3),
            versions=(v, v, v + 1),
            finish_reason="stop",
        )
        for v in versions
    )
    return Group(Prompt(pid, (1, 2), "7"), comps, tuple(rewards), start_version=min(versions))


def test_take_fresh_drops_stale_and_keeps_order() -> None:
    buf = GroupBuffer()
    buf.put(_group("old", [0, 1], [0, 0]))
    buf.put(_group("a", [0, 1], [3, 3]))
    buf.put(_group("b", [0, 1], [4, 4]))
    buf.put(_group("c", [0, 1], [5, 5]))
    fresh, stale = buf.take_fresh(step=5, max_staleness=2, count=2)
    assert [g.prompt.prompt_id for g in stale] == ["old"]
    assert [g.prompt.prompt_id for g in fresh] == ["a", "b"]
    assert len(buf) == 1


def test_take_fresh_takes_a_whole_batch_or_nothing() -> None:
    buf = GroupBuffer()
    for pid, v in (("a", 3), ("old", 0), ("b", 4)):
        buf.put(_group(pid, [0, 1], [v, v]))
    batch, stale = buf.take_fresh(step=5, max_staleness=2, count=3)
    assert batch == [] and [g.prompt.prompt_id for g in stale] == ["old"]
    assert len(buf) == 2  # the fresh ones stay, in order, for the next call
    buf.put(_group("c", [0, 1], [5, 5]))
    batch, stale = buf.take_fresh(step=5, max_staleness=2, count=3)
    assert [g.prompt.prompt_id for g in batch] == ["a", "b", "c"] and stale == [] and len(buf) == 0


def test_nearest_bound_first_takes_the_group_due_soonest() -> None:
    """Buffer order a, b, late, c (late finished after a and b but is the oldest): FIFO passes it over;
    nearest bound first takes it now (a group's own bound, adaptive admission, counts: c is due as
    soon as late)."""
    for nearest, expected in ((False, ["a", "b"]), (True, ["late", "c"])):
        buf = GroupBuffer()
        buf.put(_group("a", [0, 1], [4, 4]))
        buf.put(_group("b", [0, 1], [4, 4]))
        buf.put(_group("late", [0, 1], [3, 3]))
        buf.put(_group("c", [0, 1], [4, 4]), max_staleness=1)
        batch, stale = buf.take_fresh(step=5, max_staleness=2, count=2, nearest_bound_first=nearest)
        assert [g.prompt.prompt_id for g in batch] == expected and stale == []
        assert len(buf) == 2


def test_groups_to_samples_grpo_by_hand() -> None:
    group = _group("p", [1.0, 0.0], [2, 2])
    samples = groups_to_samples([group], AlgoConfig(advantage="grpo"))
    assert len(samples) == 2
    s0, s1 = samples
    # population std of [1, 0] is 0.5 -> advantages (1 - 0.5)/0.5 = +1 and -1 (eps 1e-6)
    assert s0.advantages[:2] == (0.0, 0.0)
    assert s0.advantages[2:] == pytest.approx((1.0,) * 3, rel=1e-5)
    assert s1.advantages[2:] == pytest.approx((-1.0,) * 3, rel=1e-5)
    assert s0.loss_mask == (0, 0, 1, 1, 1)
    assert s0.behav_logprobs == (0.0, 0.0, -0.1, -0.2, -0.3)
    assert s0.versions == (-1, -1, 2, 2, 3)
    assert (s0.min_version, s0.max_version) == (2, 3)


def test_reward_scale_and_bias_are_applied_before_the_estimator() -> None:
    group = _group("p", [1.0, 0.0, 0.0, 1.0], [0, 0, 0, 0])
    plain = groups_to_samples([group], AlgoConfig(advantage="dr_grpo"))
    scaled = groups_to_samples([group], AlgoConfig(advantage="dr_grpo", reward_scale=10.0, reward_bias=-0.5))
    assert plain[0].advantages[-1] == pytest.approx(0.5)
    assert scaled[0].advantages[-1] == pytest.approx(5.0)


def test_mixed_group_sizes_rejected() -> None:
    with pytest.raises(ValueError, match="same size"):
        groups_to_samples([_group("a", [0, 1], [0, 0]), _group("b", [0, 1, 1], [0, 0, 0])], AlgoConfig())


def test_multi_turn_completion_trains_model_tokens_only() -> None:
    """Environment tokens (loss_mask 0) get no advantage and no loss; model tokens keep theirs."""
    comps = tuple(
        Completion(
            prompt_ids=(1, 2),
            output_ids=(3, 4, 9, 9, 5),
            behav_logprobs=(-0.1, -0.2, 0.0, 0.0, -0.3),
            versions=(v, v, -1, -1, v + 1),
            finish_reason="stop",
            loss_mask=(1, 1, 0, 0, 1),
        )
        for v in (2, 3)
    )
    group = Group(Prompt("p", (1, 2), "7"), comps, (1.0, 0.0), start_version=2)
    s0, s1 = groups_to_samples([group], AlgoConfig(advantage="grpo"))
    assert s0.token_ids == (1, 2, 3, 4, 9, 9, 5)
    assert s0.loss_mask == (0, 0, 1, 1, 0, 0, 1)
    assert s0.advantages == pytest.approx((0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0), rel=1e-5)
    assert s1.advantages == pytest.approx((0.0, 0.0, -1.0, -1.0, 0.0, 0.0, -1.0), rel=1e-5)
    assert s0.versions == (-1, -1, 2, 2, -1, -1, 3)
    assert (s0.min_version, s0.max_version) == (2, 3) and (s1.min_version, s1.max_version) == (3, 4)
    assert group.min_version == 2


def test_a_groups_own_bound_is_checked_below_the_runs() -> None:
    """Adaptive admission puts each group with the η in force when it was admitted: a group admitted
    under η = 1 is dropped at staleness 2 even where the run's bound (4) and a later η allow it."""
    buf = GroupBuffer()
    buf.put(_group("tight", [0, 1], [3, 3]), 1)
    buf.put(_group("loose", [0, 1], [3, 3]), 3)
    buf.put(_group("above", [0, 1], [0, 0]), 9)  # its own bound above the run's: the run's (4) holds
    buf.put(_group("plain", [0, 1], [3, 3]))
    batch, stale = buf.take_fresh(step=5, max_staleness=4, count=2)
    assert [g.prompt.prompt_id for g in stale] == ["tight", "above"]
    assert [g.prompt.prompt_id for g in batch] == ["loose", "plain"]
    assert buf.drain() == []
