"""The staleness gate (DESIGN §4.1), against the capacity rule computed by hand."""

from __future__ import annotations

import pytest

from asyncrl.controller.staleness import EpisodeSamples, StalenessGate, group_bound, must_wait_for_stragglers


def test_synchronous_gate_admits_one_batch_per_version() -> None:
    gate = StalenessGate(batch_size=4, max_staleness=0, max_concurrent=100)
    assert gate.capacity(version=0) == 4  # (0 + 0 + 1) * 4 - 0
    gate.on_admit(4)
    assert gate.capacity(0) == 0
    for _ in range(4):
        gate.on_finish(accepted=True)
    assert gate.capacity(0) == 0  # accepted 4 = budget of version 0
    assert gate.capacity(1) == 4  # the trainer published version 1


def test_capacity_rule_by_hand() -> None:
    gate = StalenessGate(batch_size=3, max_staleness=2, max_concurrent=100)
    # (2 + 5 + 1) * 3 - (accepted + running) with accepted=10, running=4 -> 24 - 14 = 10
    gate.accepted, gate.running = 10, 4
    assert gate.capacity(5) == 10
    # the concurrency cap binds: 12 - 4 = 8
    gate.max_concurrent = 12
    assert gate.capacity(5) == 8
    # never negative
    gate.accepted = 100
    assert gate.capacity(5) == 0


def test_filtered_groups_give_their_budget_back() -> None:
    gate = StalenessGate(batch_size=2, max_staleness=0, max_concurrent=10)
    gate.on_admit(2)
    gate.on_finish(accepted=False)
    assert gate.capacity(0) == 1
    gate.on_finish(accepted=True)
    assert gate.capacity(0) == 1
    gate.on_drop_accepted()
    assert gate.capacity(0) == 2


def test_counters_survive_a_checkpoint_and_running_is_readmitted() -> None:
    gate = StalenessGate(batch_size=2, max_staleness=1, max_concurrent=10)
    gate.on_admit(3)
    gate.on_finish(True)
    gate.on_finish(True)
    restored = StalenessGate(batch_size=2, max_staleness=1, max_concurrent=10)
    restored.load_state_dict(gate.state_dict())
    assert restored.accepted == 2 and restored.running == 0
    assert restored.capacity(0) == 2  # (1 + 0 + 1) * 2 - 2


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        StalenessGate(batch_size=0, max_staleness=0, max_concurrent=1)
    gate = StalenessGate(batch_size=1, max_staleness=0, max_concurrent=1)
    with pytest.raises(RuntimeError):
        gate.on_finish(True)
    with pytest.raises(ValueError):
        StalenessGate(batch_size=1, max_staleness=0, max_concurrent=1, high_water=-1)


def test_high_water_mark_caps_buffered_plus_running() -> None:
    gate = StalenessGate(batch_size=4, max_staleness=8, max_concurrent=100, high_water=8)
    assert gate.capacity(0) == 8  # staleness would allow (8 + 0 + 1) * 4 = 36
    gate.on_admit(8)
    assert gate.capacity(0) == 0
    for _ in range(8):
        gate.on_finish(accepted=True)
    assert gate.capacity(0, buffered=8) == 0  # finished groups still count while buffered
    assert gate.capacity(0, buffered=4) == 4  # the trainer took a batch
    assert gate.capacity(0, buffered=0) == 8
    # the staleness rule still binds under the mark: accepted 34 of the 36 allowed at version 0
    gate.accepted = 34
    assert gate.capacity(0, buffered=0) == 2
    # off (0): only staleness and concurrency
    gate.high_water, gate.accepted = 0, 8
    assert gate.capacity(0, buffered=8) == 28


def test_samples_unit_counts_only_samples_still_generating() -> None:
    # B = 2 groups per batch, G = 4 samples, mark 2 batches = 4 groups = 16 samples
    gate = StalenessGate(
        batch_size=2, max_staleness=8, max_concurrent=100, high_water=4, high_water_unit="samples", group_size=4
    )
    assert gate.capacity(0) == 4
    gate.on_admit(4)
    assert gate.generating == 16 and gate.capacity(0) == 0
    gate.on_generating(-3)  # three samples ended; their groups still run
    assert gate.capacity(0) == 1  # 3 free samples: rounds up to one group
    gate.on_generating(-4)
    assert gate.capacity(0) == 2  # 7 free: two groups
    # the same state under the groups unit admits nothing: 4 groups still run
    gate.high_water_unit = "groups"
    assert gate.capacity(0) == 0
    gate.high_water_unit = "samples"
    # buffered groups weigh group_size each: 9 running + 2 buffered * 4 = 17 > 16
    assert gate.capacity(0, buffered=2) == 0
    # the staleness rule still binds: (8 + 0 + 1) * 2 = 18 groups of budget, 17 used
    gate.accepted = 13
    assert gate.capacity(0) == 1
    with pytest.raises(RuntimeError):
        gate.on_generating(-10)


def test_episode_samples_tracks_one_group_across_retries_and_ends() -> None:
    gate = StalenessGate(
        batch_size=1, max_staleness=4, max_concurrent=10, high_water=2, high_water_unit="samples", group_size=3
    )
    changes: list[int] = []
    gate.on_admit(1)
    ep = EpisodeSamples(gate, on_change=lambda: changes.append(gate.generating))
    first = ep.attempt()
    first(0)
    first(0)  # a repeated index counts once
    assert gate.generating == 2 and changes == [2]
    second = ep.attempt()  # a retry: every sample generates again
    assert gate.generating == 3
    first(1)  # a late callback of the failed attempt is ignored
    assert gate.generating == 3
    second(1)
    assert gate.generating == 2
    second(2)
    assert gate.generating == 1 and changes == [2, 2, 1]
    second(0)
    assert gate.generating == 0 and changes == [2, 2, 1, 0]
    ep.close()
    assert gate.generating == 0 and ep.left == 0
    second(0)  # after close: nothing
    ep.close()
    assert gate.generating == 0


def test_samples_unit_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        StalenessGate(batch_size=1, max_staleness=0, max_concurrent=1, high_water_unit="tokens")
    with pytest.raises(ValueError):
        StalenessGate(batch_size=1, max_staleness=0, max_concurrent=1, group_size=0)


def test_a_groups_own_bound_applies_but_never_above_the_runs() -> None:
    assert group_bound(None, 4) == 4  # no bound of its own: the run's
    assert group_bound(2, 4) == 2  # admitted under a lower η_t: held to it
    assert group_bound(6, 4) == 4  # a resume with a lower controller.max_staleness wins


def test_must_wait_for_stragglers_by_hand() -> None:
    """B = 1, step 1. Nothing running: never. A running group due now: wait. Two groups due at 2 (one
    running) and one buffered due at 3: the batch would take the buffered one, leaving two groups for
    the one place of step 2, so wait (the running group can take this batch's place). Only buffered
    groups overflowing: waiting cannot help. A running group already past its step: ignored."""
    assert not must_wait_for_stragglers(1, 1, [1, 2], [])
    assert must_wait_for_stragglers(1, 1, [], [1])
    assert must_wait_for_stragglers(1, 1, [3], [2, 2])
    assert not must_wait_for_stragglers(1, 1, [2, 3], [3])  # step 1 takes the 2; the 3s fit steps 2-3
    assert not must_wait_for_stragglers(1, 1, [2, 2, 2], [5])
    assert not must_wait_for_stragglers(1, 1, [1], [0])
    assert must_wait_for_stragglers(1, 2, [1, 1, 2, 2], [2])  # B = 2: three due by 2 for two places
