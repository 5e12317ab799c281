"""The controller's wake-ups (the backpressure table of ``controller.loop``) and its recorder, no model.

``weight_sync = drain`` waits on an event (no polling): every update lands with no episode running,
and a failed episode ends the wait. ``step_metrics`` reads one typed ``StepRecord``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from asyncrl.controller import loop as loop_module
from asyncrl.controller.loop import Controller
from asyncrl.controller.metrics import StepRecord, StepTimes, step_metrics
from asyncrl.controller.rundir import read_jsonl
from asyncrl.controller.state import ControllerState
from asyncrl.types import Completion, Group, Prompt
from tests.controller.fakes import Script, ScriptedEngine, ScriptedTrainer, StepDone
from tests.controller.test_loop_fake import _cfg, _replay_admission, _run, _stream


class _WatchedAsyncio:
    """``controller.loop``'s view of ``asyncio``, recording the loop's short sleeps (polls); the
    timeline's 0.25 s period is not one."""

    def __init__(self) -> None:
        self.polls: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, delay: float, *args: Any) -> Any:
        if 0 < delay < 0.25:
            self.polls.append(delay)
        return await asyncio.sleep(delay, *args)


def test_drain_publishes_only_when_no_episode_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scripts = {ids: Script(delay_s=0.002 * (k % 5), tail_s=0.01 * (k % 3)) for k, ids in enumerate(_stream(80))}
    engine, trainer = ScriptedEngine(scripts), ScriptedTrainer(step_s=0.002)
    running_at_update: list[int] = []
    watched = _WatchedAsyncio()
    monkeypatch.setattr(loop_module, "asyncio", watched)

    def watch(controller: Controller) -> None:
        update = engine.update_weights

        async def update_when_drained(u: Any) -> None:
            running_at_update.append(controller.gate.running)
            await update(u)

        engine.update_weights = update_when_drained  # type: ignore[method-assign]

    cfg = _cfg(controller__weight_sync="drain", controller__max_staleness=2, controller__total_steps=5)
    state = _run(cfg, engine, trainer, tmp_path, scripts, watch=watch)
    assert state.step == 5 and engine.updates == [1, 2, 3, 4, 5]
    assert running_at_update == [0] * 5  # every update waited for the running episodes
    assert watched.polls == []  # the drain waited on an event, not in sleep(0.005) polls
    _replay_admission(tmp_path, 2, 2)


def test_a_failed_episode_ends_a_drain(tmp_path: Path) -> None:
    """B = 2, η = 1: four prompts are admitted at version 0; the last two hang until their timeout,
    and with no retry the first failure stops the run, while the drain after step 0 waits on them."""
    stream = _stream(4)
    scripts = {stream[2]: Script(hang=1), stream[3]: Script(hang=1)}
    # a 1 s timeout: the two that hang time out, the two that do not finish inside it even on a loaded machine
    cfg = _cfg(
        controller__weight_sync="drain",
        controller__episode_retries=0,
        controller__episode_timeout_s=1.0,
        controller__max_engine_failures=1,
    )
    trainer = ScriptedTrainer()
    with pytest.raises(RuntimeError, match="an episode failed"):
        _run(cfg, ScriptedEngine(scripts), trainer, tmp_path, scripts)
    assert len(trainer.batches) == 1
    assert len(read_jsonl(tmp_path / "metrics.jsonl")) == 1


def _group(prompt_id: str, version: int, rewards: tuple[float, ...]) -> Group:
    completions = tuple(Completion((1,), (2, 3), (-0.5, -0.5), (version, version), "stop") for _ in rewards)
    return Group(Prompt(prompt_id, (1,), "1"), completions, rewards, version)


def test_step_metrics_reads_one_typed_record() -> None:
    groups = [_group("a", 3, (1.0, 0.0)), _group("b", 1, (1.0, 1.0))]
    state = ControllerState(step=5, trained_tokens=1000, admitted=12)
    times = StepTimes(train_start_s=9.0, end_s=10.0, wall_s=2.0, wait_s=0.5, train_s=1.0, sync_s=0.2, checkpoint_s=0.0)
    record = StepRecord(
        step=4,
        groups=groups,
        result=StepDone(5, True, {"loss": 0.25, "reward": -1.0}),
        trained_tokens=16,
        times=times,
        engine_before={"generated_tokens": 100.0},
        engine_after={"generated_tokens": 140.0},
        generated_during_train=30.0,
        state=state,
        buffer_groups=3,
        running_groups=2,
        reward_latency_s=[0.2, 0.1],
        rollout_rewards=[1.0, 0.0, 0.0, 1.0],
    )
    assert record.staleness == [1, 3]
    m = step_metrics(record)
    assert m["step"] == 4 and m["version"] == 5 and m["time_s"] == 10.0 and m["train_start_s"] == 9.0
    assert m["reward"] == 0.75 and m["accuracy"] == 0.75 and m["rollout_reward"] == 0.5
    assert m["staleness_mean"] == 2.0 and m["staleness_max"] == 3 and m["staleness_hist"] == {1: 1, 3: 1}
    assert m["trained_tokens_per_s"] == 100.0 and m["trained_tokens_per_s_step"] == 8.0
    assert m["generated_tokens_per_s"] == 20.0 and m["generated_tokens_during_train"] == 30.0
    assert m["engine_busy_frac"] is None  # this engine does not report its busy time
    assert m["trainer_busy_frac"] == pytest.approx(0.6) and m["wait_for_batch_s"] == 0.5
    assert m["reward_latency_p50_s"] == 0.2 and m["admitted_total"] == 12
    assert m["loss"] == 0.25 and m["reward"] == 0.75  # the trainer's metrics never overwrite the loop's
