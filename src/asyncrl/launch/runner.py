"""One training run over stages a launcher built: the flow every launcher shares.

A launcher (``launch.local``, ``launch.ray``) builds the ``Stages`` - an engine (or a pool of
them), a trainer (in-process, a child process, or a group of Ray ranks), the ``score`` callable -
and hands them to ``run_stages``, which does the rest identically: restore the newest checkpoint that verifies
on ``resume``, held-out accuracy before, the asynchronous loop (``controller.loop.Controller``),
held-out accuracy after, the final checkpoint and ``summary.json``. SIGINT/SIGTERM stop the loop
after the training step in progress with a checkpoint (the run can be resumed).
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.config import Config, load_config, to_dict
from asyncrl.controller.evaluate import EvalResult
from asyncrl.controller.ledger_checks import LedgerViolation, check_ledger
from asyncrl.controller.loop import Controller, LoopSettings
from asyncrl.controller.resume import check_snapshot, resume_checkpoint
from asyncrl.controller.run_claim import RunDirError, claim_run_dir, default_run_dir, read_jsonl
from asyncrl.controller.run_lock import LOCK_NAME, RunDirLocked, RunLock
from asyncrl.controller.rundir import RunDir, code_version
from asyncrl.controller.state import ControllerState
from asyncrl.data.prompts import PromptSource, build_task, drop_long_prompts
from asyncrl.launch import RunStopped
from asyncrl.launch.memory import fits_line, require_memory_fits
from asyncrl.launch.resume_guard import (
    ResumeRefused,
    check_config_changes,
    check_not_finished,
    check_offsets,
    check_restartable,
)
from asyncrl.launch.stages import build_evaluator, build_workflow
from asyncrl.rollout.api import RolloutEngine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.workflow import ScoreFn
from asyncrl.trainer.api import PolicyTrainer
from asyncrl.trainer.checkpoint import read_trainer_state


@dataclass
class Stages:
    """What a launcher hands to ``run_stages``."""

    engine: RolloutEngine
    """``LocalEngine``, ``RemoteEngine`` or an ``EnginePool`` (of those or of Ray engine clients)."""
    trainer: PolicyTrainer
    """``Trainer``, ``TrainerProcess`` or ``RayTrainerGroup``."""
    score: ScoreFn
    tokenizer: Any
    stop_token_ids: tuple[int, ...]
    model_dir: Path
    close: Callable[[], Awaitable[None]]
    """Releases everything the launcher started (called once, also on errors)."""
    summary_extra: Callable[[], Awaitable[dict[str, Any]]] | None = None
    """The launcher's own summary entries (awaited before ``close``)."""


@dataclass
class ClaimedRunDir:
    """A run directory this process holds (``prepare_run_dir``), with what a resume restores."""

    path: Path
    lock: RunLock
    """Held for the whole run; ``release()`` when it ends."""
    checkpoint: Path | None = None
    """A resume's checkpoint: the newest that verifies (None: a new run, or a resume that starts over)."""
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    """A resume's config changes: key -> (saved value, new value)."""


def loop_settings(cfg: Config, stop_token_ids: tuple[int, ...] = ()) -> LoopSettings:
    """What ``controller.loop.Controller`` reads of ``cfg``: its section, the algorithm's, how episodes sample
    (``rollout.*`` with the tokenizer's ``stop_token_ids``), the group size, the verifier's name, progress."""
    r = cfg.rollout
    sampling = SamplingParams(
        max_new_tokens=r.max_new_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        stop_token_ids=stop_token_ids,
    )
    return LoopSettings(
        controller=cfg.controller,
        algo=cfg.algo,
        sampling=sampling,
        group_size=r.group_size,
        verifier=cfg.task.verifier,
        progress=cfg.run.progress,
    )


def _lock(run_dir: Path) -> RunLock:
    """The run directory's lock, an unusable path said in one sentence (``RunDirError``)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"cannot use {run_dir} as a run directory: it is a file; choose another --run-dir")
    try:
        return RunLock(run_dir)
    except RunDirLocked as exc:
        raise RunDirError(str(exc)) from None
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise RunDirError(
            f"cannot use {run_dir} as a run directory: {why} ({exc.filename or run_dir}); nothing was run. "
            "Choose a directory this user can write (--run-dir DIR)"
        ) from None


def _new_default_run_dir() -> tuple[Path, RunLock]:
    """A new ``runs/<timestamp>[-N]`` made and locked by this process (a name another run took a moment
    before is passed over)."""
    while True:
        run_dir = default_run_dir()
        try:
            lock = _lock(run_dir)
        except RunDirError:
            if run_dir.is_dir() and (run_dir / LOCK_NAME).exists():
                continue  # another run holds it
            raise
        if lock.created:
            return run_dir, lock
        lock.release()


def prepare_run_dir(cfg: Config, *, resume: bool, overwrite: bool, allow_change: tuple[str, ...] = ()) -> ClaimedRunDir:
    """The run directory of this run (``run.run_dir`` or a new ``runs/<timestamp>``), locked for this
    process (``controller.run_lock``) and checked before anything is written to it or the warm start
    runs: a new run refuses a directory holding a run unless ``overwrite`` (moves the old run aside;
    ``controller.run_claim.claim_run_dir``); a resume needs one run there, refuses config changes it was not
    asked for, a torn jsonl file and starting over a run that trained (``launch.resume_guard``), and
    picks the checkpoint it restores (``controller.resume.resume_checkpoint``). First of all, a run whose
    estimated memory exceeds a device's is refused (``launch.memory.require_memory_fits``)."""
    check = require_memory_fits(cfg)
    if check is not None:
        print("memory: " + "; ".join(fits_line(v) for v in check.verdicts))
    if cfg.run.run_dir:
        run_dir = Path(cfg.run.run_dir)
        lock = _lock(run_dir)
    else:
        run_dir, lock = _new_default_run_dir()
    try:
        note = lock.stale_note()
        if note:
            print(note)
        moved = claim_run_dir(run_dir, resume=resume, overwrite=overwrite)
        if moved is not None:
            print(f"--overwrite: the run that was in {run_dir} is now in {moved} (nothing deleted)")
        claimed = ClaimedRunDir(run_dir, lock)
        if resume:
            saved = run_dir / "config.yaml"
            if not saved.is_file():
                raise ResumeRefused(f"cannot resume {run_dir}: it has no config.yaml (is it a run directory?)")
            claimed.changes = check_config_changes(run_dir, load_config(base=saved), cfg, allow_change)
            check_not_finished(run_dir, cfg.controller.total_steps)
            claimed.checkpoint = resume_checkpoint(run_dir)
            if claimed.checkpoint is None:
                check_restartable(run_dir)
                print(f"no checkpoint in {run_dir}, and no step was trained: starting it over")
            else:
                snapshot = check_snapshot(read_trainer_state(claimed.checkpoint, mmap=True).get("extra"))
                check_offsets(run_dir, snapshot["offsets"], claimed.checkpoint)
            if claimed.changes:
                kept = run_dir / "resume" / f"config.yaml.before-{time.strftime('%Y%m%d-%H%M%S')}"
                kept.parent.mkdir(exist_ok=True)
                shutil.copyfile(saved, kept)
                listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in claimed.changes.items())
                print(f"resuming with changed settings: {listed} (the previous config.yaml is kept as {kept})")
        return claimed
    except BaseException:
        lock.release()
        raise


def _install_stop_handlers(controller: Controller) -> list[int]:
    """First SIGINT/SIGTERM: graceful stop with a checkpoint; a second one: the default action."""
    loop = asyncio.get_running_loop()
    installed: list[int] = []

    def handler(sig: signal.Signals) -> None:
        print(f"\n{sig.name}: stopping after the current training step (checkpoint follows); again to abort")
        controller.request_stop(sig.name)
        loop.remove_signal_handler(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, handler, sig)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread / platform
            pass
    return installed


def _require_ledger(run_dir: Path, *, ended: bool, when: str) -> None:
    """Invariant 7 on the run's ledger (``controller.ledger_checks``); a violation stops the run (``RunStopped``)."""
    try:
        check_ledger(run_dir, ended=ended).require()
    except LedgerViolation as exc:
        raise RunStopped(
            f"the ledger of {run_dir} {when} breaks invariant 7 (nothing lost, nothing trained twice, staleness "
            f"bounded): {exc}. The files are left as they are for inspection; this is a bug, please report it."
        ) from None


async def run_stages(
    cfg: Config, claimed: ClaimedRunDir, stages: Stages, *, resume: bool, t_start: float, t_warm: float
) -> dict[str, Any]:
    """The run (see the module docstring) in the directory ``prepare_run_dir`` claimed; returns the summary
    (also written to ``summary.json``). ``resume``: continue from ``claimed.checkpoint`` (None: start the run
    over). ``t_start``: when the launcher started (for ``wall_s``); ``t_warm``: seconds of warm start."""
    engine, trainer, score, tokenizer = stages.engine, stages.trainer, stages.score, stages.tokenizer
    run_dir, ckpt = claimed.path, claimed.checkpoint
    try:
        snapshot: dict[str, Any] | None = None
        if ckpt is not None:
            snapshot = check_snapshot(trainer.load_checkpoint(ckpt))
            await engine.update_weights(trainer.export_weights())
            print(f"resuming {run_dir} from {ckpt.name} (step {snapshot['step']})")
        train_prompts, held_out, _ = build_task(cfg.task, tokenizer)
        train_prompts = drop_long_prompts(train_prompts, cfg.rollout.max_prompt_len, "training prompts")
        held_out = drop_long_prompts(held_out, cfg.rollout.max_prompt_len, "held-out prompts")
        truncate = snapshot["offsets"] if snapshot is not None else ({} if resume else None)
        rundir = RunDir(run_dir, to_dict(cfg), truncate=truncate, purge_step=snapshot["step"] if snapshot else None)
        if snapshot is not None:  # the ledger as the checkpoint left it: a killed run's, whole
            _require_ledger(run_dir, ended=False, when="at its checkpoint")
        workflow = build_workflow(cfg, tokenizer, stages.stop_token_ids)  # rollout.workflow
        evaluator = build_evaluator(cfg, engine, held_out, score, stages.stop_token_ids, workflow=workflow)

        async def measure() -> EvalResult:
            """Held-out accuracy as configured, plus greedy accuracy (its tool use, and by kind, where the
            episodes and prompts have them) when ``eval.report_greedy``."""
            result = await evaluator()
            if cfg.eval.report_greedy:
                greedy = await build_evaluator(
                    cfg, engine, held_out, score, stages.stop_token_ids, greedy=True, workflow=workflow
                )()
                result["greedy_accuracy"] = greedy["accuracy"]
                for key in ("tool_call_hit_rate", "episode_tool_call_frac", "episode_tool_hit_frac"):
                    if key in greedy:
                        result[f"greedy_{key}"] = greedy[key]
                if "by_kind" in greedy:
                    result["greedy_by_kind"] = greedy["by_kind"]
            return result

        after: EvalResult | None = None
        before = dict(snapshot["launcher"]["before"]) if snapshot is not None else await measure()
        print(f"held-out accuracy before RL: {before['accuracy']:.3f} (greedy {before.get('greedy_accuracy')})")
        controller = Controller(
            loop_settings(cfg, stages.stop_token_ids),
            engine,
            trainer,
            PromptSource(train_prompts, cfg.run.seed),
            score,
            rundir,
            tokenizer=tokenizer,
            resume=snapshot,
            evaluator=evaluator,
            workflow=workflow,
            checkpoint_extra={"before": before},
        )
        handlers = _install_stop_handlers(controller)
        try:
            state = await controller.run()
        finally:
            for sig in handlers:
                asyncio.get_running_loop().remove_signal_handler(sig)
        if state.stop_reason is None:
            after = await measure()
            print(f"held-out accuracy after RL:  {after['accuracy']:.3f} (greedy {after.get('greedy_accuracy')})")
            ckpt_final = run_dir / "checkpoint"
            trainer.save_pretrained(str(ckpt_final))
            tokenizer.save_pretrained(str(ckpt_final))
        else:
            print(
                f"stopped ({state.stop_reason}) at step {state.step}; continue with: asyncrl train --resume {run_dir}"
            )
        extra = await stages.summary_extra() if stages.summary_extra else {}  # first: may refresh engine counters
        engine_stats = engine.stats()
    finally:
        await stages.close()
    summary = _summary(cfg, state, before, after, engine_stats, run_dir, stages.model_dir)
    summary.update(wall_s=time.perf_counter() - t_start, warm_start_s=t_warm, **extra)
    rundir.write_summary(summary)
    rundir.close()
    _require_ledger(run_dir, ended=True, when="at the end of the run")
    return summary


def _summary(
    cfg: Config,
    state: ControllerState,
    before: EvalResult,
    after: EvalResult | None,
    engine_stats: dict[str, Any],
    run_dir: Path,
    model_dir: Path,
) -> dict[str, Any]:
    """``summary.json`` (DESIGN §7) but the launcher's times and entries: held-out accuracy before and after,
    the controller's counters (``ControllerState.summary``), the engine's, and how the run ended."""
    generated = engine_stats.get("generated_tokens", 0.0)
    # generation overlapping training: tokens the engine produced while a training step ran
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    during_train = float(sum(m.get("generated_tokens_during_train") or 0.0 for m in metrics))
    e = cfg.eval
    mode = "greedy" if e.greedy else f"sampled at T={cfg.rollout.temperature}, {e.samples_per_prompt} per prompt"
    return {
        "accuracy_before": before["accuracy"],
        "accuracy_after": after["accuracy"] if after else None,
        "accuracy_gain": after["accuracy"] - before["accuracy"] if after else None,
        "accuracy_mode": mode,
        "accuracy_greedy_before": before.get("greedy_accuracy"),
        "accuracy_greedy_after": after.get("greedy_accuracy") if after else None,
        "response_len_before": before["response_len"],
        "response_len_after": after["response_len"] if after else None,
        "eval_before": before,
        "eval_after": after,
        **state.summary(),
        # what ended a run that was not stopped: its step count or its RL-time budget
        "ended_by": None
        if state.stop_reason
        else "total_steps"
        if state.step >= cfg.controller.total_steps
        else "max_rl_time_s",
        "max_staleness": cfg.controller.max_staleness,
        "code": code_version(),
        "engine_generated_tokens": generated,
        "generated_tokens_during_train_steps": during_train,
        "generation_during_training_frac": during_train / max(1.0, generated),
        "engine_slot_utilisation": engine_stats.get("slot_utilisation", 0.0),
        "launcher": cfg.launch.kind,
        "model_dir": str(model_dir),
        "checkpoint": str(run_dir / "checkpoint") if after else None,
    }
