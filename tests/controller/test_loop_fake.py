"""The controller's loop (``controller.loop.Controller``) on a scripted engine and trainer, no model.

Each test runs the real loop (admission, gate, episodes, buffer, batcher, publish, checkpoints,
run directory) in well under a second over ``tests.controller.fakes``: admission within the
staleness budget and the concurrency cap, no sample trained more than η versions old (a group
held back until it is stale is dropped, not trained, or waited for with ``controller.stragglers=wait``),
the high-water mark in groups and in
samples, retries of failed or hung generation and of a failed scoring, failures that are not
retried (verification, equal rewards, a non-finite step), the stop after consecutive engine
failures, and a checkpoint then resume after a kill and after a graceful stop (the ledger then
passes the same checks as ``tests/invariants/test_no_loss_on_resume.py``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from asyncrl.config import Config, load_config, to_dict, with_values
from asyncrl.controller.ledger_checks import check_ledger
from asyncrl.controller.loop import Controller
from asyncrl.controller.resume import check_snapshot, latest_checkpoint
from asyncrl.controller.rundir import RunDir, read_jsonl
from asyncrl.controller.state import ControllerState
from asyncrl.data.prompts import PromptSource
from asyncrl.launch.runner import loop_settings
from asyncrl.rollout.api import RolloutEngine
from asyncrl.trainer.api import PolicyTrainer
from asyncrl.types import Prompt
from tests.controller.fakes import Crash, Script, ScriptedEngine, ScriptedTrainer, scripted_score
from tests.invariants import test_no_loss_on_resume as invariant
from tests.protocol_check import protocol_problems

PROMPTS = [Prompt(f"p{i}", (i + 1,), "1") for i in range(400)]


def _stream(n: int) -> list[tuple[int, ...]]:
    """Token ids of the first ``n`` prompts in the order the controller admits them (seed 0)."""
    source = PromptSource(PROMPTS, 0)
    return [source.next().token_ids for _ in range(n)]


def _cfg(**sets: Any) -> Config:
    values: dict[str, Any] = {
        "controller.batch_size": 2,
        "controller.max_staleness": 1,
        "controller.total_steps": 6,
        "controller.max_concurrent": 16,
        "controller.high_water_batches": 0,
        "controller.checkpoint_every": 0,
        "controller.episode_timeout_s": 0,
        "rollout.group_size": 2,
        "rollout.max_new_tokens": 8,
        "algo.filter_equal_rewards": False,
        "run.progress": False,
    }
    values.update({k.replace("__", "."): v for k, v in sets.items()})
    return load_config(None, [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items()])


def _run(
    cfg: Config,
    engine: ScriptedEngine,
    trainer: ScriptedTrainer,
    run_dir: Path,
    scripts: dict[tuple[int, ...], Script] | None = None,
    *,
    resume: dict[str, Any] | None = None,
    watch: Any = None,
) -> ControllerState:
    """One ``Controller.run`` (``watch(controller)`` may hook it first); the run directory closed after."""

    async def main() -> ControllerState:
        rundir = RunDir(run_dir, to_dict(cfg), tensorboard=False, truncate=resume["offsets"] if resume else None)
        controller = Controller(
            loop_settings(cfg),
            engine,
            trainer,
            PromptSource(PROMPTS, 0),
            scripted_score(scripts or {}),
            rundir,
            resume=resume,
        )
        if watch is not None:
            watch(controller)
        try:
            return await asyncio.wait_for(controller.run(), 120)  # a hang guard: these runs take seconds
        finally:
            rundir.close()

    return asyncio.run(main())


def _resume(cfg: Config, run_dir: Path, **trainer_kw: Any) -> ControllerState:
    """What ``launch.runner.run_stages`` does on ``--resume``: the newest checkpoint into a fresh
    trainer, its weights into a fresh engine, the run directory cut back, the controller restored."""
    trainer = ScriptedTrainer(**trainer_kw)
    snapshot = check_snapshot(trainer.load_checkpoint(latest_checkpoint(run_dir)))
    engine = ScriptedEngine()
    asyncio.run(engine.update_weights(trainer.export_weights()))
    return _run(cfg, engine, trainer, run_dir, resume=snapshot)


def _ledger(run_dir: Path, status: str) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(run_dir / "trajectories.jsonl") if r["status"] == status]


def _replay_admission(run_dir: Path, eta: int, batch: int) -> None:
    """The staleness budget replayed from the ledger: at every admission at version v, the groups
    admitted and not given back (filtered, stale, failed) fit (η + v + 1) * B."""
    live = 0
    for r in read_jsonl(run_dir / "trajectories.jsonl"):
        if r["status"] == "admitted":
            live += 1
            assert live <= (eta + r["start_version"] + 1) * batch, r
        elif r["status"] in ("filtered", "stale", "engine_failure") and r["sample_idx"] in (0, None):
            live -= 1


def test_the_fakes_satisfy_the_protocols() -> None:
    assert protocol_problems(ScriptedEngine, RolloutEngine) == []
    assert protocol_problems(ScriptedTrainer, PolicyTrainer) == []


@pytest.mark.parametrize("eta", [0, 2])
def test_admission_stays_within_the_staleness_budget_and_the_concurrency_cap(tmp_path: Path, eta: int) -> None:
    steps, batch = 8, 2
    scripts = {ids: Script(delay_s=0.001 * (k % 4)) for k, ids in enumerate(_stream(60))}
    engine, trainer = ScriptedEngine(scripts), ScriptedTrainer(step_s=0.003)
    cfg = _cfg(controller__max_staleness=eta, controller__total_steps=steps, controller__max_concurrent=3)
    state = _run(cfg, engine, trainer, tmp_path, scripts)
    assert state.step == steps and trainer.version == steps and engine.updates == list(range(1, steps + 1))
    for step, trained in enumerate(trainer.batches):  # what the trainer was given, step by step
        assert trained.version == step and len(trained.samples) == batch * 2
        assert all(step - s.min_version <= eta for s in trained.samples)
    assert state.max_staleness_seen <= eta
    assert engine.max_in_flight == min(3, (eta + 1) * batch)  # the cap, or the budget where it is lower
    _replay_admission(tmp_path, eta, batch)
    if eta == 0:  # synchronous: the batch of step i is generated by version i exactly
        assert {s.min_version for b in trainer.batches for s in b.samples} == set(range(steps))
    assert [m["step"] for m in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(steps))


def test_a_group_that_comes_back_too_stale_is_dropped_not_trained(tmp_path: Path) -> None:
    """η = 1, B = 1: the first prompt's group is held until the engine holds version 3, so it
    comes back with version 0 tokens when step 3 or later would train it: dropped as stale."""
    first = _stream(1)[0]
    scripts = {first: Script(hold_until=3)}
    engine, trainer = ScriptedEngine(scripts), ScriptedTrainer()
    state = _run(_cfg(controller__batch_size=1, controller__total_steps=5), engine, trainer, tmp_path, scripts)
    assert state.step == 5 and state.stale_groups == 1
    stale = _ledger(tmp_path, "stale")
    assert [r["prompt_id"] for r in stale] == ["p" + str(first[0] - 1)] * 2 and stale[0]["min_version"] == 0
    assert stale[0]["step"] - stale[0]["min_version"] > 1
    assert first not in {s.token_ids[:1] for b in trainer.batches for s in b.samples}
    assert all(b.version - s.min_version <= 1 for b in trainer.batches for s in b.samples)


def _straggler_run(run_dir: Path, policy: str) -> tuple[ControllerState, ScriptedTrainer, tuple[int, ...]]:
    """η = 1, B = 1, steps of 0.1 s: the first prompt's group takes 0.5 s, every other one returns at once."""
    first = _stream(1)[0]
    scripts = {first: Script(tail_s=0.5)}
    engine, trainer = ScriptedEngine(scripts), ScriptedTrainer(step_s=0.1)
    cfg = _cfg(controller__batch_size=1, controller__total_steps=8, controller__stragglers=policy)
    return _run(cfg, engine, trainer, run_dir, scripts), trainer, first


def test_a_straggler_is_dropped_or_waited_for_as_controller_stragglers_says(tmp_path: Path) -> None:
    """``drop``: the slow group finishes after step 1 (its last trainable step) and is dropped;
    ``wait``: step 1 waits for it and trains it, nothing is dropped, and no trained sample is more
    than η versions old either way."""
    dropped, trainer, first = _straggler_run(tmp_path / "drop", "drop")
    assert dropped.stale_groups == 1
    assert first not in {s.token_ids[:1] for b in trainer.batches for s in b.samples}
    waited, trainer, first = _straggler_run(tmp_path / "wait", "wait")
    assert waited.step == 8 and waited.stale_groups == 0 and _ledger(tmp_path / "wait", "stale") == []
    trained_at = [b.version for b in trainer.batches for s in b.samples if s.token_ids[:1] == first]
    assert trained_at == [1, 1]  # both samples, at the group's last trainable step (admitted at 0, η = 1)
    assert all(b.version - s.min_version <= 1 for b in trainer.batches for s in b.samples)
    _replay_admission(tmp_path / "wait", 1, 1)


def test_wait_keeps_a_group_that_later_admissions_would_crowd_out(tmp_path: Path) -> None:
    """η = 2, B = 1: version 0 admits p0 (fast), p1 and p2 (slow), all due by step 2. p3, admitted at
    version 1 and fast, would take step 1 and leave p1 and p2 one place at step 2; ``wait`` sees that at
    step 1 (two groups due by step 2, one place) and waits, so all of them are trained in time."""
    slow = _stream(3)[1:]
    scripts = {ids: Script(tail_s=0.4) for ids in slow}
    for policy, stale in (("drop", 2), ("wait", 0)):
        trainer = ScriptedTrainer(step_s=0.1)
        cfg = _cfg(
            controller__batch_size=1,
            controller__max_staleness=2,
            controller__total_steps=6,
            controller__stragglers=policy,
        )
        state = _run(cfg, ScriptedEngine(scripts), trainer, tmp_path / policy, scripts)
        assert state.stale_groups == stale and state.step == 6
        assert all(b.version - s.min_version <= 2 for b in trainer.batches for s in b.samples)
    trained = {s.token_ids[:1] for b in trainer.batches for s in b.samples}
    assert all(ids in trained for ids in slow)


def test_waiting_for_stragglers_changes_nothing_in_a_synchronous_run(tmp_path: Path) -> None:
    """η = 0: every group of a version is in its step's batch anyway, so ``wait`` trains what ``drop``
    does, a slow group included (both wait for it)."""
    scripts = {_stream(3)[2]: Script(tail_s=0.2)}
    runs = {}
    for policy in ("drop", "wait"):
        trainer = ScriptedTrainer()
        _run(
            _cfg(controller__max_staleness=0, controller__stragglers=policy),
            ScriptedEngine(scripts),
            trainer,
            tmp_path / policy,
            scripts,
        )
        runs[policy] = [[s.token_ids for s in b.samples] for b in trainer.batches]
    assert runs["drop"] == runs["wait"] and len(runs["wait"]) == 6


def _run_ahead(run_dir: Path, unit: str, mark: int) -> tuple[ScriptedTrainer, list[tuple[int, int, int]]]:
    """A run with η = 4 and a slow trainer; every admission records (buffered groups, running
    groups, samples generating) just after it."""
    scripts = {ids: Script(delay_s=0.001, tail_s=0.02) for ids in _stream(200)}
    engine, trainer = ScriptedEngine(scripts), ScriptedTrainer(step_s=0.02)
    ahead: list[tuple[int, int, int]] = []

    def watch(controller: Controller) -> None:
        gate, admit = controller.gate, controller.gate.on_admit

        def on_admit(n: int = 1) -> None:
            admit(n)
            ahead.append((len(controller.buffer), gate.running, gate.generating))

        gate.on_admit = on_admit  # type: ignore[method-assign]

    cfg = _cfg(
        controller__max_staleness=4,
        controller__total_steps=4,
        controller__high_water_batches=mark,
        controller__high_water_unit=unit,
    )
    _run(cfg, engine, trainer, run_dir, scripts, watch=watch)
    return trainer, ahead


@pytest.mark.parametrize("unit", ["groups", "samples"])
def test_the_high_water_mark_bounds_how_far_generation_runs_ahead(tmp_path: Path, unit: str) -> None:
    """η = 4 would let 10 groups run ahead of a slow trainer; a mark of one batch (2 groups of 2)
    keeps buffered + running groups at 2, or, in samples, buffered samples plus those still
    generating under 4 + a group's round-up, while groups waiting on a long last sample do not count."""
    trainer, ahead = _run_ahead(tmp_path / "mark", unit, 1)
    assert all(b.version - s.min_version <= 4 for b in trainer.batches for s in b.samples)
    if unit == "groups":
        assert max(b + r for b, r, _ in ahead) == 2
    else:
        assert max(2 * b + g for b, _, g in ahead) <= 4 + 1
        assert max(r for _, r, _ in ahead) > 2  # groups waiting on their tail leave room
    _, ahead = _run_ahead(tmp_path / "none", unit, 0)
    assert max(b + r for b, r, _ in ahead) > 4  # without the mark it runs further ahead


def test_failed_generation_and_scoring_are_retried_other_failures_are_recorded(tmp_path: Path) -> None:
    """η = 0, B = 2, two retries, a 1 s episode timeout: a failing, a hanging and a
    scoring-error prompt are retried and trained; one failing every attempt is dropped
    (``engine_failure``); failed verification and equal rewards are filtered; a non-finite step is
    skipped (its groups are in the ledger as such)."""
    s = _stream(6)
    scripts = {
        s[0]: Script(fail=1),
        s[1]: Script(hang=1),
        s[2]: Script(score_raises=1),
        s[3]: Script(fail=3),
        s[4]: Script(reward_failure="timeout"),
        s[5]: Script(uniform=True),
    }
    engine, trainer = ScriptedEngine(scripts), ScriptedTrainer(non_finite=frozenset({1}))
    cfg = _cfg(
        controller__max_staleness=0,
        controller__total_steps=4,
        controller__episode_retries=2,
        controller__episode_timeout_s=1.0,
        algo__filter_equal_rewards=True,
    )
    # 1 s: only the hang may time out, the instant episodes not even on a loaded machine (counts below exact)
    state = _run(cfg, engine, trainer, tmp_path, scripts)
    assert state.step == 4 and state.skipped_steps == 1
    assert state.episode_retries == 1 + 1 + 1 + 2 and state.engine_failures == 1
    assert engine.calls[s[0]] == 2 and engine.calls[s[1]] == 2 and engine.calls[s[3]] == 3
    fate: dict[tuple[int, ...], set[str]] = {}
    for r in read_jsonl(tmp_path / "trajectories.jsonl"):
        if r["status"] not in ("admitted", "resumed"):
            fate.setdefault((int(r["prompt_id"][1:]) + 1,), set()).add(r["status"])
    assert fate[s[3]] == {"engine_failure"} and fate[s[4]] == {"filtered"} and fate[s[5]] == {"filtered"}
    assert all(fate[ids] <= {"trained", "skipped"} for ids in s[:3])
    reasons = {r["dropped"] for r in _ledger(tmp_path, "filtered")}
    assert reasons == {"reward_failure: timeout", "equal_rewards"} and state.reward_failures == 2
    skipped = _ledger(tmp_path, "skipped")
    assert len(skipped) == 2 * 2 and {r["dropped"] for r in skipped} == {"non_finite_step"}
    assert state.trained_samples == 3 * 2 * 2


def test_consecutive_engine_failures_stop_the_run(tmp_path: Path) -> None:
    scripts = {ids: Script(fail=99) for ids in _stream(50)}
    cfg = _cfg(controller__episode_retries=0, controller__max_engine_failures=3)
    with pytest.raises(RuntimeError, match="an episode failed") as err:
        _run(cfg, ScriptedEngine(scripts), ScriptedTrainer(), tmp_path, scripts)
    assert "3 consecutive episodes failed" in str(err.value.__cause__)


def _resume_cfg() -> Config:
    """The invariant test's run: 10 steps of 4 groups of 4, η = 2, a checkpoint every 2 steps."""
    return _cfg(
        controller__total_steps=invariant.STEPS,
        controller__batch_size=invariant.BATCH,
        rollout__group_size=invariant.GROUP,
        controller__max_staleness=invariant.ETA,
        controller__max_concurrent=12,
        controller__checkpoint_every=2,
    )


def test_a_killed_run_resumes_from_its_checkpoint_with_nothing_lost_or_trained_twice(tmp_path: Path) -> None:
    cfg = _resume_cfg()
    with pytest.raises(Crash):  # killed in step 5: the newest checkpoint is the one before step 4
        _run(cfg, ScriptedEngine(), ScriptedTrainer(step_s=0.002, crash_at=5), tmp_path)
    assert latest_checkpoint(tmp_path).name == "step-00000004"
    state = _resume(cfg, tmp_path, step_s=0.002)
    assert state.step == invariant.STEPS and state.resumes == 1 and state.stop_reason is None
    counts = invariant.check_ledger(tmp_path)  # every prompt admitted once in order, one fate each, ...
    assert counts["readmitted"] > 0  # what was in flight or buffered at the checkpoint came back first


def test_a_stop_request_checkpoints_and_the_run_resumes(tmp_path: Path) -> None:
    cfg = _resume_cfg()
    engine, trainer = ScriptedEngine(), ScriptedTrainer(step_s=0.002)

    def watch(controller: Controller) -> None:  # SIGTERM once version 3 is published
        update = engine.update_weights

        async def update_then_stop(u: Any) -> None:
            await update(u)
            if u.version == 3:
                controller.request_stop("SIGTERM")

        engine.update_weights = update_then_stop  # type: ignore[method-assign]

    stopped = _run(cfg, engine, trainer, tmp_path, watch=watch)
    assert stopped.stop_reason == "SIGTERM" and stopped.step == 3
    assert latest_checkpoint(tmp_path).name == "step-00000003"  # the stop saved one
    state = _resume(cfg, tmp_path)
    assert state.step == invariant.STEPS and state.resumes == 1
    invariant.check_ledger(tmp_path)


def test_a_resume_that_ends_before_admitting_again_gives_those_prompts_a_fate(tmp_path: Path) -> None:
    """Resumed at a step count the run already reached: it ends at once, before the prompts the
    checkpoint held open are admitted again; each gets a prompt-level ``in_flight`` line
    (``not_readmitted_at_end``) instead of none, and a later resume with more steps admits them again."""
    cfg = _resume_cfg()
    engine, trainer = ScriptedEngine(), ScriptedTrainer(step_s=0.002)

    def watch(controller: Controller) -> None:
        update = engine.update_weights

        async def update_then_stop(u: Any) -> None:
            await update(u)
            if u.version == 3:
                controller.request_stop("SIGTERM")

        engine.update_weights = update_then_stop  # type: ignore[method-assign]

    _run(cfg, engine, trainer, tmp_path, watch=watch)
    state = _resume(with_values(cfg, {"controller.total_steps": 3}), tmp_path)
    assert state.step == 3
    pending = [r for r in _ledger(tmp_path, "in_flight") if r.get("dropped") == "not_readmitted_at_end"]
    assert pending, "the checkpoint held open prompts; each must get a fate"
    check_ledger(tmp_path, ended=True).require()  # no prompt lost
    state = _resume(cfg, tmp_path)
    assert state.step == invariant.STEPS
    invariant.check_ledger(tmp_path)


def test_a_time_budget_ends_the_run_like_its_last_step(tmp_path: Path) -> None:
    """``controller.max_rl_time_s``: no step starts once the RL time reached the budget; the step
    under way finishes and the run ends as after ``total_steps`` (final checkpoint, no stop reason)."""
    trainer = ScriptedTrainer(step_s=0.05)
    cfg = _cfg(controller__total_steps=1000, controller__max_rl_time_s=0.3, controller__max_staleness=0)
    state = _run(cfg, ScriptedEngine(), trainer, tmp_path)
    assert 1 <= state.step < 1000 and state.stop_reason is None
    assert state.rl_elapsed_s >= 0.3
    assert state.rl_elapsed_s < 0.3 + 20.0  # stopped at the budget, not at total_steps (1000 steps: 50 s)
    assert latest_checkpoint(tmp_path).name == f"step-{state.step:08d}"
    assert [m["step"] for m in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(state.step))
    assert _cfg(controller__max_rl_time_s=0).controller.max_rl_time_s == 0  # 0: no budget
