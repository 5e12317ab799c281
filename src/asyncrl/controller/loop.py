"""The asynchronous RL controller: admission, rollouts, batching, training, weight sync, checkpoints.

::

      PromptSource ──next()──► admit loop ──(StalenessGate.capacity(v) > 0)──► episode task
      (re-admitted prompts          ▲        (ledger: admitted)       (engine.generate_group
       of a resume first)           │ wake                             + score; retried on
                                    │                                   failure / timeout)
                                    │                        filtered ◄─(all rewards equal)─┤
                                    │                        (ledger)                       ▼ Group
      engines ◄── update_weights(v+1) ◄── train loop ◄── take_fresh(step, η) ◄── GroupBuffer
      (abort | keep in flight,            (trainer executor:   (stale → dropped,
       or drain first)                     batch + prox +       ledger)
                                           PPO step; a non-finite
                                           step is skipped)
                                                │ every checkpoint_every steps, at the end,
                                                ▼ on SIGINT/SIGTERM
                                   checkpoints/step-k (trainer state + controller snapshot)

Generation never waits for training: the engine decodes in its own thread, the trainer batches
and steps from an executor thread (``run_in_executor``; the local launcher puts the trainer
itself in its own process, ``controller.trainer_process``, so it shares no GIL with the engine),
and this asyncio loop only moves prompts, groups and weights. A training step i starts from
version i and publishes version i + 1 (DESIGN §7); the new weights reach the engine in flight.
With ``max_staleness = 0`` the gate admits one batch per version and the same code trains
synchronously. ``controller.fixed_lag = k`` (``controller.fixed_lag``) is the same synchronous
loop with the engine's weights k versions behind: step i trains on samples of version max(0, i - k).

The bookkeeping (counters, the ledger, metrics, the progress bar) is one object,
``controller.recorder.RunRecorder``, so the loops below show only their real calls. Every admitted
prompt is tracked there until its fate is in the ledger; a checkpoint saves the counters, the
prompt-stream position, the ledger offsets and the open prompts (``controller.resume`` documents
the snapshot), so a resumed run re-admits what was in flight and trains nothing twice.

Backpressure: who waits on whom. Every wake-up in this module is one row here; each waiter clears
its event and re-checks its condition after a wake-up, so a spurious one costs one iteration.

=================  ==================  ================================  =============================================
loop (consumes)    waits on            until                             set by
=================  ==================  ================================  =============================================
``_admit_loop``    ``_wake_admit``     ``gate.capacity(v, buffered)``    ``_episode_left_gate``: an episode accepted,
(prompts; starts                       ``> 0`` and no drain is on        filtered or failed left the gate
episode tasks)                                                           ``EpisodeSamples``: a sample ended
                                                                         (``high_water_unit = samples``)
                                                                         ``_next_batch``: a batch taken or stale groups
                                                                         dropped (the buffer shrank)
                                                                         ``_publish``: version v+1 is live (a new
                                                                         staleness budget; a drain is over)
                                                                         ``_train_loop``: a new adaptive setting
                                                                         ``run``: the run is stopping
``_next_batch``    ``_wake_train``     ``take_fresh`` gives a whole      ``_episode``: a group entered the buffer
(train loop:                           batch, an episode failed, or a    ``_fail``: an episode task raised, or too many
the buffer)                            stop was requested; with          engine failures in a row
                                       ``stragglers = wait``, first no   ``request_stop``: SIGINT/SIGTERM
                                       running group must be in this     ``_in_flight_done``: an episode task ended
                                       batch to be trained in time       (``stragglers = wait``)
``_drain``         ``_episode_end``    ``gate.running == 0`` (no         ``_episode_left_gate``; ``_fail``
(``weight_sync``                       episode generating or scoring),
``= drain``)                           or an episode failed
episode task       the engine and      the group is generated and        the engine thread; the reward workers
(engine, reward)   the reward          scored
=================  ==================  ================================  =============================================
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from asyncrl.config import AlgoConfig, ControllerConfig
from asyncrl.controller.adaptive import adaptive_admission
from asyncrl.controller.buffer import GroupBuffer, groups_to_samples
from asyncrl.controller.evaluate import EvalResult
from asyncrl.controller.fixed_lag import LaggedWeights
from asyncrl.controller.outcomes import EpisodeOutcomes, describe
from asyncrl.controller.recorder import RunRecorder
from asyncrl.controller.resume import prompt_at, restore_snapshot, save_checkpoint, take_snapshot
from asyncrl.controller.rundir import RunDir
from asyncrl.controller.snapshots import PolicySnapshots
from asyncrl.controller.staleness import EpisodeSamples, StalenessGate, group_bound, must_wait_for_stragglers
from asyncrl.controller.state import ControllerState
from asyncrl.data.prompts import PromptSource
from asyncrl.rollout.api import RolloutEngine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.workflow import ScoreFn, Workflow, run_episode
from asyncrl.trainer.api import PolicyTrainer, TrainStepResult
from asyncrl.types import Completion, Group, Prompt, TrainBatch, TrainSample


@dataclass(frozen=True)
class LoopSettings:
    """What the loop reads of a run's config, and nothing more (the full ``Config`` stays in ``launch/``)."""

    controller: ControllerConfig
    """Admission, staleness, checkpoints, failures, weight sync (the ``controller`` section)."""
    algo: AlgoConfig
    """Advantages and the equal-reward filter (the ``algo`` section: ``groups_to_samples`` reads it)."""
    sampling: SamplingParams
    """How each episode samples (``rollout.*``, the tokenizer's stop ids)."""
    group_size: int
    """Samples per prompt (``rollout.group_size``)."""
    verifier: str = ""
    """The reward's name, for the message when scoring keeps failing (``task.verifier``)."""
    progress: bool = True
    """Show a progress bar (``run.progress``)."""


class Controller:
    """Runs the asynchronous loop of one training run (see the module docstring)."""

    def __init__(
        self,
        settings: LoopSettings,
        engine: RolloutEngine,
        trainer: PolicyTrainer,
        source: PromptSource,
        score: ScoreFn,
        rundir: RunDir,
        *,
        tokenizer: Any = None,
        resume: dict[str, Any] | None = None,
        checkpoint_extra: dict[str, Any] | None = None,
        evaluator: Callable[[], Awaitable[EvalResult]] | None = None,
        workflow: Workflow = run_episode,
    ) -> None:
        """``settings``: what the loop reads of the run's config (``LoopSettings``; ``launch.runner.loop_settings``
        builds it). ``resume``: the controller snapshot of the checkpoint the trainer was restored from.
        ``checkpoint_extra``: the launcher's own values, saved with every checkpoint.
        ``evaluator``: held-out accuracy every ``controller.eval_every`` steps (the launcher's,
        ``launch.runner``: the task's held-out split on this engine, decoded as ``eval.*`` says).
        ``workflow``: what one episode is (``rollout.workflow``; ``launch.stages.build_workflow``)."""
        self.settings = settings
        self.engine = engine
        self.trainer = trainer
        self.source = source
        self.score = score
        self.rundir = rundir
        self.tokenizer = tokenizer
        self.checkpoint_extra = dict(checkpoint_extra or {})
        self.evaluator = evaluator
        self.workflow = workflow
        c = settings.controller
        self.gate = StalenessGate(
            c.batch_size,
            0 if c.fixed_lag is not None else c.max_staleness,  # a fixed lag admits synchronously
            c.max_concurrent,
            high_water=c.high_water_batches * c.batch_size,
            high_water_unit=c.high_water_unit,
            group_size=settings.group_size,
        )
        self.adaptive = adaptive_admission(c, self.gate)  # None unless controller.adaptive: η_t and mark per step
        self.buffer = GroupBuffer()
        LaggedWeights.check_resume(c.fixed_lag, resume is not None)
        self.lag = LaggedWeights(c.fixed_lag) if c.fixed_lag is not None else None
        self.published_version = trainer.version
        self.sampling = settings.sampling
        self._in_flight: dict[asyncio.Task, tuple[Prompt, int]] = {}
        self._last_step: dict[asyncio.Task, int] = {}  # episode -> the last step sure to train it (stragglers)
        self._readmit: deque[int] = deque()  # stream indices to admit again first (resume)
        # the three wake-ups of the backpressure table (module docstring)
        self._wake_admit = asyncio.Event()
        self._wake_train = asyncio.Event()
        self._episode_end = asyncio.Event()
        self._stopping = False
        self._stop_reason: str | None = None
        self._draining = False
        self._errors: list[BaseException] = []
        self.outcomes = EpisodeOutcomes(
            c.max_engine_failures, settings.algo.filter_equal_rewards, settings.verifier, self._fail
        )
        self._last_checkpoint_step: int | None = None
        self._snapshots = PolicySnapshots(c.snapshot_every_s, rundir.path, rundir.log_snapshot)
        self._resumed = resume is not None
        state = self._restore(resume) if resume is not None else ControllerState()
        self.recorder = RunRecorder(
            state,
            rundir,
            engine,
            self.gate,
            self.buffer,
            tokenizer=tokenizer,
            total_steps=c.total_steps,
            progress=settings.progress,
        )

    @property
    def state(self) -> ControllerState:
        """The run's counters (kept by the recorder, saved with every checkpoint)."""
        return self.recorder.state

    # ------------------------------------------------------------------ resume and stop
    def _restore(self, snapshot: dict[str, Any]) -> ControllerState:
        state, readmit = restore_snapshot(snapshot, self.trainer.version, self.gate, self.adaptive, self.source)
        self._readmit = deque(readmit)
        self._last_checkpoint_step = state.step
        return state

    def request_stop(self, reason: str) -> None:
        """Stop after the training step in progress (if any) with a checkpoint (SIGINT/SIGTERM)."""
        if self._stop_reason is None:
            self._stop_reason = reason
        self._wake_train.set()

    def _fail(self, error: BaseException) -> None:
        """Stop the run with ``error``: the train loop raises at its next wait, a drain stops waiting."""
        self._errors.append(error)
        self._wake_train.set()
        self._episode_end.set()

    def snapshot(self) -> dict[str, Any]:
        """The controller's share of a checkpoint (see ``controller.resume``); one consistent cut:
        call it on the event-loop thread between two training steps."""
        return take_snapshot(
            self.state,
            self.recorder.now(),
            self.gate.accepted - len(self.buffer),
            self.adaptive,
            self.source,
            list(self._readmit) + self.recorder.open_indices(),
            self.rundir.offsets(),
            self.checkpoint_extra,
        )

    async def _checkpoint(self, executor: ThreadPoolExecutor) -> None:
        snapshot = self.snapshot()
        with self.recorder.checkpointing():
            await save_checkpoint(
                executor,
                self.trainer,
                self.rundir.path,
                snapshot,
                self.tokenizer,
                self.settings.controller.keep_checkpoints,
            )
        self._last_checkpoint_step = snapshot["step"]

    async def _snapshot_policy(self, executor: ThreadPoolExecutor, *, final: bool = False) -> None:
        """The published policy into ``snapshots/`` when due (``controller.snapshots``)."""
        await self._snapshots.maybe_save(
            executor,
            self.trainer,
            self.tokenizer,
            self.published_version,
            self.state.step,
            self.recorder.now(),
            final=final,
        )

    # ------------------------------------------------------------------ admission and episodes
    async def _admit_loop(self) -> None:
        while not self._stopping:
            capacity = 0 if self._draining else self.gate.capacity(self.published_version, len(self.buffer))
            for _ in range(capacity):
                prompt, index, readmitted = self._next_prompt()
                self.gate.on_admit()
                version = self.published_version
                bound = self.gate.max_staleness if self.adaptive is not None else None  # η_t, trained within it
                self.recorder.admitted(prompt, index, version, readmitted, bound)
                task = asyncio.create_task(self._episode(prompt, version, bound))
                self._in_flight[task] = (prompt, version)
                if self.settings.controller.stragglers == "wait":
                    self._last_step[task] = version + group_bound(bound, self.settings.controller.max_staleness)
                task.add_done_callback(self._in_flight_done)
            self._wake_admit.clear()
            await self._wake_admit.wait()

    def _next_prompt(self) -> tuple[Prompt, int, bool]:
        """(prompt, its stream index, re-admitted): a resume's open prompts first, then the stream."""
        if self._readmit:
            index = self._readmit.popleft()
            return prompt_at(self.source, index), index, True
        index = self.source.position
        return self.source.next(), index, False

    def _in_flight_done(self, task: asyncio.Task) -> None:
        self._in_flight.pop(task, None)
        if self._last_step.pop(task, None) is not None:
            self._wake_train.set()  # a straggler the trainer may be waiting for has ended
        if not task.cancelled() and task.exception() is not None:
            self._fail(task.exception())  # type: ignore[arg-type]

    async def _timed_score(self, prompt: Prompt, completion: Completion) -> tuple[float, str | None]:
        with self.recorder.reward_call():
            return await self.score(prompt, completion)

    async def _sample_timeline(self, period_s: float = 0.25) -> None:
        """Record what each component is doing a few times a second (``timeline.jsonl``)."""
        while not self._stopping:
            self.recorder.log_timeline(self.published_version)
            await asyncio.sleep(period_s)

    async def _attempt(self, prompt: Prompt, version: int, on_sample_done: Callable[[int], None]) -> Group:
        episode = self.workflow(
            self.engine,
            prompt,
            self.sampling,
            self.settings.group_size,
            self._timed_score,
            version,
            on_sample_done,
        )
        timeout = self.settings.controller.episode_timeout_s
        return await (asyncio.wait_for(episode, timeout) if timeout > 0 else episode)

    async def _episode(self, prompt: Prompt, version: int, bound: int | None = None) -> None:
        """One admitted prompt to its fate; ``bound``: its own staleness bound (adaptive admission)."""
        c = self.settings.controller
        group: Group | None = None
        error: BaseException | None = None
        live = EpisodeSamples(self.gate, self._wake_admit.set if self.gate.high_water_unit == "samples" else None)
        try:
            for attempt in range(c.episode_retries + 1):
                try:
                    group = await self._attempt(prompt, version, live.attempt())
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # engine failure or timeout: retry, then drop
                    error = exc
                    if attempt < c.episode_retries:
                        self.recorder.episode_retry()
        except asyncio.CancelledError:
            live.close()
            self.gate.on_cancel()
            raise
        live.close()
        if group is None:
            self._engine_failure(prompt, version, error)
            return
        if not any(f is not None for f in group.reward_failures):
            self.recorder.rollout_scored(group.rewards)
        reason = self.outcomes.judge(group)  # may stop the run: scoring failures in a row
        if reason is None:
            self.gate.on_finish(accepted=True)
            self.buffer.put(group, bound)
            self._wake_train.set()
        else:
            self.gate.on_finish(accepted=False)
            self.recorder.filtered(group, reason)
        self._episode_left_gate()

    def _episode_left_gate(self) -> None:
        """An episode ended (accepted, filtered or failed): room under the gate; a drain may be over."""
        self._wake_admit.set()
        self._episode_end.set()

    def _engine_failure(self, prompt: Prompt, version: int, error: BaseException | None) -> None:
        self.gate.on_finish(accepted=False)
        self.recorder.engine_failure(prompt, version, describe(error))
        self.outcomes.engine_failed(error)  # may stop the run: engine failures in a row
        self._episode_left_gate()

    # ------------------------------------------------------------------ training
    async def _train_loop(self, executor: ThreadPoolExecutor) -> None:
        """Until ``total_steps`` (or the RL-time budget, or a stop): a fresh batch, one training step,
        the new weights to the engine, the step recorded; held-out evaluation and a checkpoint when due."""
        record, c = self.recorder, self.settings.controller
        while self.state.step < c.total_steps and self._stop_reason is None:
            if c.max_rl_time_s and record.now() >= c.max_rl_time_s:
                record.note(f"controller.max_rl_time_s={c.max_rl_time_s:g} reached after {self.state.step} steps")
                break
            step = self.state.step
            with record.waiting():
                groups = await self._next_batch(step)
            if groups is None:
                break
            with record.training():
                samples, result = await self._train(executor, groups, step)
            with record.syncing():
                await self._publish(executor, result.version)
            await self._snapshot_policy(executor)
            metrics = record.step_trained(step, groups, samples, result)
            if self.adaptive is not None:  # the setting for the next admissions, from what this step measured
                metrics.update(self.adaptive.step(metrics))
                self._wake_admit.set()
            if self._evaluation_due():
                metrics.update(await self._evaluate())
            record.log_step(metrics)
            if self._checkpoint_due():
                await self._checkpoint(executor)

    async def _next_batch(self, step: int) -> list[Group] | None:
        """The groups of step ``step`` (None: a stop was requested while waiting)."""
        c = self.settings.controller
        while True:
            if self._errors:
                raise RuntimeError("an episode failed") from self._errors[0]
            if self._stop_reason is not None:
                return None
            wait = c.stragglers == "wait"
            if wait and must_wait_for_stragglers(
                step, c.batch_size, self.buffer.last_steps(c.max_staleness), self._last_step.values()
            ):
                self._wake_train.clear()  # a group still generating must be in this batch to be trained in time
                await self._wake_train.wait()
                continue
            batch, stale = self.buffer.take_fresh(step, c.max_staleness, c.batch_size, nearest_bound_first=wait)
            for _ in stale:
                self.gate.on_drop_accepted()
            self.recorder.stale(stale, step)
            if batch or stale:
                self._wake_admit.set()  # room under the high-water mark: generate during the step
            if batch:
                return batch
            self._wake_train.clear()
            await self._wake_train.wait()

    async def _train(
        self, executor: ThreadPoolExecutor, groups: list[Group], step: int
    ) -> tuple[list[TrainSample], TrainStepResult]:
        return await asyncio.get_running_loop().run_in_executor(executor, self._train_blocking, groups, step)

    def _train_blocking(self, groups: list[Group], step: int) -> tuple[list[TrainSample], TrainStepResult]:
        """Batching and the training step, on the executor thread (the step may run in the trainer process)."""
        samples = groups_to_samples(groups, self.settings.algo, self.sampling.max_new_tokens)
        return samples, self.trainer.train_step(TrainBatch(tuple(samples), step))

    async def _publish(self, executor: ThreadPoolExecutor, version: int) -> None:
        """Export the new weights and load them into the engine; ``version`` is live afterwards."""
        if self.settings.controller.weight_sync == "drain":
            await self._drain()
        update = await asyncio.get_running_loop().run_in_executor(executor, self.trainer.export_weights)
        if self.lag is not None:  # controlled staleness: the engine loads version v - k
            await self.lag.publish(self.engine, update)
        else:
            await self.engine.update_weights(update)
        self._draining = False
        self.published_version = version
        self._wake_admit.set()

    async def _drain(self) -> None:
        """``weight_sync = drain``: admit nothing more and wait until no episode runs (or one failed)."""
        self._draining = True
        while self.gate.running > 0 and not self._errors:
            self._episode_end.clear()
            await self._episode_end.wait()

    def _evaluation_due(self) -> bool:
        c, n = self.settings.controller, self.state.step  # the final evaluation is the launcher's accuracy_after
        return bool(c.eval_every and self.evaluator and n % c.eval_every == 0 and n < c.total_steps)

    async def _evaluate(self) -> dict[str, Any]:
        """Held-out accuracy now, as ``eval_*`` metrics and the seconds it took."""
        assert self.evaluator is not None
        start = time.perf_counter()
        metrics = {f"eval_{k}": v for k, v in (await self.evaluator()).items()}
        metrics["eval_s"] = time.perf_counter() - start
        return metrics

    def _checkpoint_due(self) -> bool:
        c, n = self.settings.controller, self.state.step
        return bool(c.checkpoint_every and n % c.checkpoint_every == 0 and n < c.total_steps)

    async def run(self) -> ControllerState:
        """Train until ``controller.total_steps`` steps (or a stop request); returns the counters.
        Saves a checkpoint at the end (and on a stop) unless one was just taken."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asyncrl-trainer")
        self.recorder.start(readmit=len(self._readmit) if self._resumed else None)
        admit = asyncio.create_task(self._admit_loop())
        sampler = asyncio.create_task(self._sample_timeline())
        for task in (admit, sampler):  # a failed write there (a full disk) stops the run like a failed episode
            task.add_done_callback(self._in_flight_done)
        try:
            await self._snapshot_policy(executor)  # the starting policy, at RL time 0
            if self.lag is not None:
                loop = asyncio.get_running_loop()
                await self.lag.start(lambda: loop.run_in_executor(executor, self.trainer.export_weights))
            self.recorder.begin_steps()
            await self._train_loop(executor)
            if self.lag is not None:  # the final evaluation measures the trained policy
                await self.lag.finish(self.engine)
            await self._snapshot_policy(executor, final=True)
            self.state.stop_reason = self._stop_reason
            if self._last_checkpoint_step != self.state.step:
                await self._checkpoint(executor)
        finally:
            self.state.rl_elapsed_s = self.recorder.now()
            self._stopping = True
            self._wake_admit.set()
            admit.cancel()
            sampler.cancel()
            snapshot = dict(self._in_flight)
            for task in snapshot:
                task.cancel()
            await asyncio.gather(admit, sampler, *snapshot, return_exceptions=True)
            for task, (prompt, version) in snapshot.items():
                if task.cancelled():
                    self.recorder.in_flight_at_end(prompt, version)
            for index in self._readmit:  # a resume's prompts the run ended before admitting again
                self.recorder.in_flight_at_end(prompt_at(self.source, index), self.state.step, "not_readmitted_at_end")
            self.recorder.unused_at_end(self.buffer.drain())
            executor.shutdown(wait=True)
            self.recorder.close()
        return self.state
