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

Every admitted prompt is tracked until its fate is in the ledger (``_open``); a checkpoint saves
the counters, the prompt-stream position, the ledger offsets and the open prompts
(``controller.resume`` documents the snapshot), so a resumed run re-admits what was in flight and
trains nothing twice.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tqdm import tqdm

from asyncrl.config import Config
from asyncrl.controller.buffer import GroupBuffer, groups_to_samples
from asyncrl.controller.fixed_lag import LaggedWeights
from asyncrl.controller.metrics import step_metrics, timeline_sample
from asyncrl.controller.resume import (
    SNAPSHOT_FORMAT,
    check_snapshot,
    checkpoint_dir,
    prompt_at,
    prune_checkpoints,
)
from asyncrl.controller.rundir import RunDir
from asyncrl.controller.snapshots import PolicySnapshots
from asyncrl.controller.staleness import EpisodeSamples, StalenessGate
from asyncrl.controller.state import ControllerState
from asyncrl.data.prompts import PromptSource
from asyncrl.rollout.api import RolloutEngine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.workflow import ScoreFn, run_episode
from asyncrl.storage import DiskFull, with_run_dir
from asyncrl.trainer.api import PolicyTrainer, TrainStepResult
from asyncrl.types import Completion, Group, Prompt, TrainBatch, TrainSample


class Controller:
    """Runs the asynchronous loop of one training run (see the module docstring)."""

    def __init__(
        self,
        cfg: Config,
        engine: RolloutEngine,
        trainer: PolicyTrainer,
        source: PromptSource,
        score: ScoreFn,
        rundir: RunDir,
        *,
        tokenizer: Any = None,
        stop_token_ids: tuple[int, ...] = (),
        resume: dict[str, Any] | None = None,
        checkpoint_extra: dict[str, Any] | None = None,
        evaluator: Callable[[], Awaitable[dict[str, float]]] | None = None,
    ) -> None:
        """``resume``: the controller snapshot of the checkpoint the trainer was restored from.
        ``checkpoint_extra``: the launcher's own values, saved with every checkpoint.
        ``evaluator``: held-out accuracy every ``controller.eval_every`` steps (the launcher's,
        ``launch.runner``: the task's held-out split on this engine, decoded as ``eval.*`` says)."""
        self.cfg = cfg
        self.engine = engine
        self.trainer = trainer
        self.source = source
        self.score = score
        self.rundir = rundir
        self.tokenizer = tokenizer
        self.checkpoint_extra = dict(checkpoint_extra or {})
        self.evaluator = evaluator
        c = cfg.controller
        self.gate = StalenessGate(
            c.batch_size,
            0 if c.fixed_lag is not None else c.max_staleness,  # a fixed lag admits synchronously
            c.max_concurrent,
            high_water=c.high_water_batches * c.batch_size,
            high_water_unit=c.high_water_unit,
            group_size=cfg.rollout.group_size,
        )
        self.buffer = GroupBuffer()
        LaggedWeights.check_resume(c.fixed_lag, resume is not None)
        self.lag = LaggedWeights(c.fixed_lag) if c.fixed_lag is not None else None
        self.state = ControllerState()
        self.published_version = trainer.version
        self.sampling = SamplingParams(
            max_new_tokens=cfg.rollout.max_new_tokens,
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            top_k=cfg.rollout.top_k,
            stop_token_ids=stop_token_ids,
        )
        self._in_flight: dict[asyncio.Task, tuple[Prompt, int]] = {}
        self._open: dict[str, int] = {}  # prompt id -> stream index, admitted and fate not yet recorded
        self._readmit: deque[int] = deque()  # stream indices to admit again first (resume)
        self._wake_admit = asyncio.Event()
        self._wake_train = asyncio.Event()
        self._stopping = False
        self._stop_reason: str | None = None
        self._draining = False
        self._errors: list[BaseException] = []
        self._reward_latency: list[float] = []
        self._rollout_rewards: list[float] = []  # every scored sample since the last step (filtered ones too)
        self._consecutive_failures = 0
        self._scoring = 0
        self._training = False
        self._checkpointing = False
        self._checkpoint_s = 0.0
        self._last_checkpoint_step: int | None = None
        self._snapshots = PolicySnapshots(c.snapshot_every_s, rundir.path, rundir.log_snapshot)
        self._elapsed0 = 0.0
        self._run_start = time.perf_counter()
        self._resumed = resume is not None
        if resume is not None:
            self._restore(resume)

    # ------------------------------------------------------------------ resume and stop
    def _restore(self, snapshot: dict[str, Any]) -> None:
        snap = check_snapshot(snapshot)
        step = int(snap["step"])
        if self.trainer.version != step:
            raise ValueError(f"resume: trainer is at version {self.trainer.version}, snapshot at step {step}")
        self.state = ControllerState.from_dict(snap["state"])
        self.state.step = step
        self.state.resumes += 1
        self.state.stop_reason = None
        self.gate.load_state_dict(snap["gate"])
        self.source.load_state_dict(snap["source"])
        self._readmit = deque(int(i) for i in snap["readmit"])
        self._elapsed0 = float(self.state.rl_elapsed_s)
        self._last_checkpoint_step = step

    def request_stop(self, reason: str) -> None:
        """Stop after the training step in progress (if any) with a checkpoint (SIGINT/SIGTERM)."""
        if self._stop_reason is None:
            self._stop_reason = reason
        self._wake_train.set()

    def _now(self) -> float:
        """RL wall time of the run so far (seconds, across resumes)."""
        return self._elapsed0 + time.perf_counter() - self._run_start

    def snapshot(self) -> dict[str, Any]:
        """The controller's share of a checkpoint (see ``controller.resume``); one consistent cut:
        call it on the event-loop thread between two training steps."""
        state = self.state.to_dict()
        state["rl_elapsed_s"] = self._now()
        return {
            "format": SNAPSHOT_FORMAT,
            "step": self.state.step,
            "state": state,
            "gate": {"accepted": self.gate.accepted - len(self.buffer)},
            "source": self.source.state_dict(),
            "readmit": list(self._readmit) + list(self._open.values()),
            "offsets": self.rundir.offsets(),
            "launcher": self.checkpoint_extra,
        }

    async def _checkpoint(self, executor: ThreadPoolExecutor) -> None:
        extra = self.snapshot()
        step = self.state.step
        t0 = time.perf_counter()
        self._checkpointing = True
        try:
            await asyncio.get_running_loop().run_in_executor(
                executor, self.trainer.save_checkpoint, checkpoint_dir(self.rundir.path, step), extra, self.tokenizer
            )
        except DiskFull as exc:  # the trainer does not know the run: name it in the resume hint
            raise with_run_dir(exc, self.rundir.path) from exc.__cause__
        finally:
            self._checkpointing = False
        prune_checkpoints(self.rundir.path, self.cfg.controller.keep_checkpoints)
        self._checkpoint_s += time.perf_counter() - t0
        self._last_checkpoint_step = step

    async def _snapshot_policy(self, executor: ThreadPoolExecutor, *, final: bool = False) -> None:
        """The published policy into ``snapshots/`` when due (``controller.snapshots``)."""
        await self._snapshots.maybe_save(
            executor, self.trainer, self.tokenizer, self.published_version, self.state.step, self._now(), final=final
        )

    # ------------------------------------------------------------------ admission and episodes
    async def _admit_loop(self) -> None:
        while not self._stopping:
            capacity = 0 if self._draining else self.gate.capacity(self.published_version, len(self.buffer))
            for _ in range(capacity):
                readmitted = bool(self._readmit)
                if readmitted:
                    index = self._readmit.popleft()
                    prompt = prompt_at(self.source, index)
                else:
                    index = self.source.position
                    prompt = self.source.next()
                self.gate.on_admit()
                version = self.published_version
                self._open[prompt.prompt_id] = index
                self.state.admitted += 1
                self.state.readmitted += int(readmitted)
                self.rundir.log_admitted(prompt.prompt_id, index, version, readmitted)
                task = asyncio.create_task(self._episode(prompt, version))
                self._in_flight[task] = (prompt, version)
                task.add_done_callback(self._in_flight_done)
            self._wake_admit.clear()
            await self._wake_admit.wait()

    def _in_flight_done(self, task: asyncio.Task) -> None:
        self._in_flight.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            self._errors.append(task.exception())
            self._wake_train.set()

    async def _timed_score(self, prompt: Prompt, completion: Completion) -> tuple[float, str | None]:
        t0 = time.perf_counter()
        self._scoring += 1
        try:
            result = await self.score(prompt, completion)
        finally:
            self._scoring -= 1
        self._reward_latency.append(time.perf_counter() - t0)
        return result

    async def _sample_timeline(self, period_s: float = 0.25) -> None:
        """Record what each component is doing a few times a second (``timeline.jsonl``)."""
        while not self._stopping:
            self.rundir.log_timeline(
                timeline_sample(
                    self._now(), self.engine.stats(), trainer_busy=self._training, checkpointing=self._checkpointing,
                    reward_in_flight=self._scoring, buffer_groups=len(self.buffer), running_groups=self.gate.running,
                    version=self.published_version, generating_samples=self.gate.generating,
                )
            )  # fmt: skip
            await asyncio.sleep(period_s)

    async def _attempt(self, prompt: Prompt, version: int, on_sample_done: Callable[[int], None]) -> Group:
        episode = run_episode(
            self.engine, prompt, self.sampling, self.cfg.rollout.group_size, self._timed_score, version,
            on_sample_done,
        )  # fmt: skip
        timeout = self.cfg.controller.episode_timeout_s
        return await (asyncio.wait_for(episode, timeout) if timeout > 0 else episode)

    async def _episode(self, prompt: Prompt, version: int) -> None:
        c = self.cfg.controller
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
                        self.state.episode_retries += 1
        except asyncio.CancelledError:
            live.close()
            self.gate.on_cancel()
            raise
        live.close()
        if group is None:
            self._engine_failure(prompt, version, error)
            return
        self._consecutive_failures = 0
        if not any(f is not None for f in group.reward_failures):
            self._rollout_rewards.extend(group.rewards)
        reason = self._filter_reason(group)
        if reason is None:
            self.gate.on_finish(accepted=True)
            self.buffer.put(group)
            self._wake_train.set()
        else:
            self.gate.on_finish(accepted=False)
            self.state.filtered_groups += 1
            self._open.pop(prompt.prompt_id, None)
            self.rundir.log_group(group, trained_step=None, dropped=reason, status="filtered")
        self._wake_admit.set()

    def _engine_failure(self, prompt: Prompt, version: int, error: BaseException | None) -> None:
        self.gate.on_finish(accepted=False)
        self.state.engine_failures += 1
        self._consecutive_failures += 1
        self._open.pop(prompt.prompt_id, None)
        what = f"{type(error).__name__}: {error}" if error is not None else "unknown"
        self.rundir.log_prompt_dropped(prompt.prompt_id, version, "engine_failure", f"engine_failure: {what}")
        if self._consecutive_failures >= self.cfg.controller.max_engine_failures:
            failure = RuntimeError(f"{self._consecutive_failures} consecutive episodes failed after retries: {what}")
            failure.__cause__ = error
            self._errors.append(failure)
            self._wake_train.set()
        self._wake_admit.set()

    def _filter_reason(self, group: Group) -> str | None:
        failures = [f for f in group.reward_failures if f is not None]
        if failures:
            self.state.reward_failures += len(failures)
            return f"reward_failure: {failures[0]}"
        if self.cfg.algo.filter_equal_rewards and len(set(group.rewards)) == 1:
            return "equal_rewards"
        return None

    # ------------------------------------------------------------------ training
    async def _next_batch(self, step: int) -> list[Group] | None:
        """The groups of step ``step`` (None: a stop was requested while waiting)."""
        c = self.cfg.controller
        while True:
            if self._errors:
                raise RuntimeError("an episode failed") from self._errors[0]
            if self._stop_reason is not None:
                return None
            batch, stale = self.buffer.take_fresh(step, c.max_staleness, c.batch_size)
            for group in stale:
                self.gate.on_drop_accepted()
                self.state.stale_groups += 1
                self._open.pop(group.prompt.prompt_id, None)
                self.rundir.log_group(group, trained_step=None, dropped="stale", status="stale", step=step)
            if batch:
                self._wake_admit.set()  # room under the high-water mark: generate during the step
                return batch
            if stale:
                self._wake_admit.set()
            self._wake_train.clear()
            await self._wake_train.wait()

    def _train_blocking(self, groups: list[Group], step: int) -> tuple[list[TrainSample], TrainStepResult]:
        """Batching and the training step, on the executor thread (the step may run in the trainer process)."""
        samples = groups_to_samples(groups, self.cfg.algo, self.cfg.rollout.max_new_tokens)
        return samples, self.trainer.train_step(TrainBatch(tuple(samples), step))

    async def _publish(self, executor: ThreadPoolExecutor) -> float:
        """Export the new weights and load them into the engine; returns the seconds it took."""
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        if self.cfg.controller.weight_sync == "drain":
            self._draining = True
            while self.gate.running > 0 and not self._errors:
                await asyncio.sleep(0.005)
        update = await loop.run_in_executor(executor, self.trainer.export_weights)
        if self.lag is not None:  # controlled staleness: the engine loads version v - k
            await self.lag.publish(self.engine, update)
        else:
            await self.engine.update_weights(update)
        self._draining = False
        return time.perf_counter() - t0

    async def _train_loop(self, executor: ThreadPoolExecutor, bar: tqdm) -> None:
        loop = asyncio.get_running_loop()
        c = self.cfg.controller
        last_time = time.perf_counter()
        last_engine = self.engine.stats()
        while self.state.step < c.total_steps and self._stop_reason is None:
            step = self.state.step
            t_wait = time.perf_counter()
            groups = await self._next_batch(step)
            if groups is None:
                break
            wait_s = time.perf_counter() - t_wait
            gen_before = self.engine.stats()["generated_tokens"]
            t_train = time.perf_counter()
            train_start = self._now()
            self._training = True
            try:
                samples, result = await loop.run_in_executor(executor, self._train_blocking, groups, step)
            finally:
                self._training = False
            train_s = time.perf_counter() - t_train
            gen_during = self.engine.stats()["generated_tokens"] - gen_before
            sync_s = await self._publish(executor)
            self.published_version = result.version
            self._wake_admit.set()
            await self._snapshot_policy(executor)

            staleness = [step - g.min_version for g in groups]
            for g in groups:
                self._open.pop(g.prompt.prompt_id, None)
                if result.applied:
                    self.rundir.log_group(
                        g, trained_step=step, dropped=None, status="trained", tokenizer=self.tokenizer
                    )
                else:  # a non-finite loss or gradient: the update was not applied
                    self.rundir.log_group(g, trained_step=None, dropped="non_finite_step", status="skipped", step=step)
            trained_tokens = sum(len(s.token_ids) for s in samples)
            if result.applied:
                self.state.staleness_hist.update(staleness)
                self.state.max_staleness_seen = max(self.state.max_staleness_seen, *staleness)
                self.state.trained_tokens += trained_tokens
                self.state.trained_samples += len(samples)
            else:
                self.state.skipped_steps += 1
            self.state.step += 1

            now = time.perf_counter()
            engine_now = self.engine.stats()
            latency, self._reward_latency = self._reward_latency, []
            checkpoint_s, self._checkpoint_s = self._checkpoint_s, 0.0
            rollout, self._rollout_rewards = self._rollout_rewards, []
            record = step_metrics(
                step, groups, result, staleness, trained_tokens, engine_now, last_engine, now - last_time,
                now=self._now(), state=self.state, buffer_groups=len(self.buffer), running_groups=self.gate.running,
                reward_latency=latency, rollout_rewards=rollout, checkpoint_s=checkpoint_s,
                train_start=train_start, wait_s=wait_s, train_s=train_s, sync_s=sync_s, gen_during=gen_during,
            )  # fmt: skip
            n = self.state.step  # the final evaluation is the launcher's accuracy_after
            if c.eval_every and self.evaluator and n % c.eval_every == 0 and n < c.total_steps:
                t_eval = time.perf_counter()
                record.update({f"eval_{k}": v for k, v in (await self.evaluator()).items()})
                record["eval_s"] = time.perf_counter() - t_eval
            self.rundir.log_step(record)
            last_time, last_engine = now, engine_now
            bar.update(1)
            bar.set_postfix(
                reward=f"{record['reward']:.2f}",
                stale=f"{record['staleness_mean']:.1f}",
                tok_s=f"{record['trained_tokens_per_s']:.0f}",
            )
            if not result.applied:
                tqdm.write(f"step {step}: non-finite loss or gradient, update skipped (ledger: status=skipped)")
            if c.checkpoint_every and self.state.step % c.checkpoint_every == 0 and self.state.step < c.total_steps:
                await self._checkpoint(executor)

    async def run(self) -> ControllerState:
        """Train until ``controller.total_steps`` steps (or a stop request); returns the counters.
        Saves a checkpoint at the end (and on a stop) unless one was just taken."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asyncrl-trainer")
        bar = tqdm(
            total=self.cfg.controller.total_steps,
            initial=self.state.step,
            desc="rl",
            disable=not self.cfg.run.progress,
            dynamic_ncols=True,
        )
        self._run_start = time.perf_counter()
        if self._resumed:
            self.rundir.log_resumed(self.state.step, len(self._readmit))
        admit = asyncio.create_task(self._admit_loop())
        sampler = asyncio.create_task(self._sample_timeline())
        for task in (admit, sampler):  # a failed write there (a full disk) stops the run like a failed episode
            task.add_done_callback(self._in_flight_done)
        try:
            await self._snapshot_policy(executor)  # the starting policy, at RL time 0
            if self.lag is not None:
                loop = asyncio.get_running_loop()
                await self.lag.start(lambda: loop.run_in_executor(executor, self.trainer.export_weights))
            await self._train_loop(executor, bar)
            if self.lag is not None:  # the final evaluation measures the trained policy
                await self.lag.finish(self.engine)
            await self._snapshot_policy(executor, final=True)
            self.state.stop_reason = self._stop_reason
            if self._last_checkpoint_step != self.state.step:
                await self._checkpoint(executor)
        finally:
            self.state.rl_elapsed_s = self._now()
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
                    self.rundir.log_in_flight(prompt.prompt_id, version)
            for group in self.buffer.drain():
                self.rundir.log_group(group, trained_step=None, dropped="unused_at_end", status="unused")
            executor.shutdown(wait=True)
            bar.close()
        return self.state
