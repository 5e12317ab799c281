"""The bookkeeping of one run (``RunRecorder``): counters, the ledger, the step's metrics, the progress bar.

The controller's loops decide what happens; they tell the recorder, and the recorder writes it down:

- **the ledger** (``trajectories.jsonl``): every prompt's fate (admitted, filtered, failed, stale,
  trained or skipped, in flight or unused at the end), together with the registry of open prompts
  (admitted, fate not yet recorded) that a checkpoint re-admits on resume, so the two never disagree;
- **the counters** (``ControllerState``, saved with every checkpoint);
- **the measurements**: the RL clock across resumes, where each step's time went (``waiting``,
  ``training``, ``syncing``, ``checkpointing``), reward latencies, rewards of every scored sample;
- **the outputs**: one ``metrics.jsonl`` line per step (``metrics.step_metrics`` over a typed
  ``StepRecord``), ``timeline.jsonl`` samples, the progress bar.

It decides nothing and wakes no one: the loop's control flow stays in ``controller.loop``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tqdm import tqdm

from asyncrl.controller.buffer import GroupBuffer
from asyncrl.controller.metrics import StepRecord, StepTimes, step_metrics, timeline_sample
from asyncrl.controller.rundir import RunDir
from asyncrl.controller.staleness import StalenessGate
from asyncrl.controller.state import ControllerState
from asyncrl.rollout.api import RolloutEngine
from asyncrl.trainer.api import TrainStepResult
from asyncrl.types import Group, Prompt, TrainSample


class RunRecorder:
    """Counters, ledger, metrics and progress of one ``Controller.run`` (see the module docstring)."""

    def __init__(
        self,
        state: ControllerState,
        rundir: RunDir,
        engine: RolloutEngine,
        gate: StalenessGate,
        buffer: GroupBuffer,
        *,
        tokenizer: Any = None,
        total_steps: int,
        progress: bool,
    ) -> None:
        """``state``: the counters to go on from (restored from a checkpoint on resume); ``engine``,
        ``gate`` and ``buffer`` are read, never changed (their queues go into the metrics)."""
        self.state = state
        self.rundir = rundir
        self.engine = engine
        self.gate = gate
        self.buffer = buffer
        self.tokenizer = tokenizer
        self.total_steps = total_steps
        self.progress = progress
        self.trainer_busy = False
        """The trainer is stepping (``timeline.jsonl``)."""
        self.checkpoint_in_progress = False
        self.rewards_in_flight = 0
        self._open: dict[str, int] = {}  # prompt id -> stream index: admitted, fate not yet recorded
        self._elapsed0 = float(state.rl_elapsed_s)
        self._run_start = time.perf_counter()
        self._bar: tqdm | None = None
        # since the previous step was recorded
        self._reward_latency: list[float] = []
        self._rollout_rewards: list[float] = []
        self._checkpoint_s = 0.0
        self._last_time = time.perf_counter()
        self._last_engine: dict[str, float] = {}
        # the step in progress
        self._wait_s = self._train_s = self._sync_s = 0.0
        self._train_start = 0.0
        self._generated_during_train = 0.0

    # ------------------------------------------------------------------ the run
    def start(self, readmit: int | None) -> None:
        """The run starts (``readmit``: prompts to admit again on a resume, None for a fresh run)."""
        self._bar = tqdm(
            total=self.total_steps, initial=self.state.step, desc="rl", disable=not self.progress, dynamic_ncols=True
        )
        self._run_start = time.perf_counter()
        if readmit is not None:
            self.rundir.log_resumed(self.state.step, readmit)

    def begin_steps(self) -> None:
        """The train loop starts: the first step's wall time and engine throughput count from here."""
        self._last_time = time.perf_counter()
        self._last_engine = self.engine.stats()

    def now(self) -> float:
        """RL wall time of the run so far (seconds, across resumes)."""
        return self._elapsed0 + time.perf_counter() - self._run_start

    def note(self, message: str) -> None:
        """A line for the user, printed above the progress bar."""
        tqdm.write(message)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def _log_group(self, group: Group, **fate: Any) -> None:
        """``RunDir.log_group`` with the RL clock's offset (tool waits go into the ledger on that clock)."""
        self.rundir.log_group(group, rl_offset=self.now() - time.time(), **fate)

    # ------------------------------------------------------------------ the ledger: each prompt's fate
    def admitted(
        self, prompt: Prompt, stream_index: int, version: int, readmitted: bool, max_staleness: int | None = None
    ) -> None:
        """``max_staleness``: the η in force for this admission when it changes (``controller.adaptive``)."""
        self._open[prompt.prompt_id] = stream_index
        self.state.admitted += 1
        self.state.readmitted += int(readmitted)
        self.rundir.log_admitted(prompt.prompt_id, stream_index, version, readmitted, max_staleness)

    def open_indices(self) -> list[int]:
        """Stream indices of the prompts admitted whose fate is not recorded yet (re-admitted on resume)."""
        return list(self._open.values())

    def filtered(self, group: Group, reason: str) -> None:
        """A scored group not trained: its rewards all equal, or a reward failed."""
        self.state.reward_failures += sum(1 for f in group.reward_failures if f is not None)
        self.state.filtered_groups += 1
        self._open.pop(group.prompt.prompt_id, None)
        self._log_group(group, trained_step=None, dropped=reason, status="filtered")

    def engine_failure(self, prompt: Prompt, version: int, what: str) -> None:
        """An episode that failed after all its retries (``what``: the last error)."""
        self.state.engine_failures += 1
        self._open.pop(prompt.prompt_id, None)
        self.rundir.log_prompt_dropped(prompt.prompt_id, version, "engine_failure", f"engine_failure: {what}")

    def stale(self, groups: list[Group], step: int) -> None:
        """Groups too old to train at ``step``, dropped by the batcher."""
        for group in groups:
            self.state.stale_groups += 1
            self._open.pop(group.prompt.prompt_id, None)
            self._log_group(group, trained_step=None, dropped="stale", status="stale", step=step)

    def in_flight_at_end(self, prompt: Prompt, version: int, reason: str = "in_flight_at_end") -> None:
        """A prompt admitted and without a fate when the run ended: in flight, or (``not_readmitted_at_end``)
        waiting to be admitted again after a resume; the next resume cuts this line and admits it again."""
        self.rundir.log_in_flight(prompt.prompt_id, version, reason)

    def unused_at_end(self, groups: list[Group]) -> None:
        for group in groups:
            self._log_group(group, trained_step=None, dropped="unused_at_end", status="unused")

    # ------------------------------------------------------------------ measurements
    def episode_retry(self) -> None:
        self.state.episode_retries += 1

    def rollout_scored(self, rewards: list[float]) -> None:
        """Rewards of a scored group (trained or not), for the step's rollout reward."""
        self._rollout_rewards.extend(rewards)

    @contextmanager
    def reward_call(self) -> Iterator[None]:
        """One call of the reward function: in flight while inside, its latency kept if it returns."""
        start = time.perf_counter()
        self.rewards_in_flight += 1
        try:
            yield
        finally:
            self.rewards_in_flight -= 1
        self._reward_latency.append(time.perf_counter() - start)

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """The train loop waits for a fresh batch."""
        start = time.perf_counter()
        yield
        self._wait_s = time.perf_counter() - start

    @contextmanager
    def training(self) -> Iterator[None]:
        """The trainer batches and steps; the engine's tokens generated meanwhile are counted."""
        generated = self.engine.stats()["generated_tokens"]
        start = time.perf_counter()
        self._train_start = self.now()
        self.trainer_busy = True
        try:
            yield
        finally:
            self.trainer_busy = False
        self._train_s = time.perf_counter() - start
        self._generated_during_train = self.engine.stats()["generated_tokens"] - generated

    @contextmanager
    def syncing(self) -> Iterator[None]:
        """New weights go to the engine (after a drain in ``drain`` mode)."""
        start = time.perf_counter()
        yield
        self._sync_s = time.perf_counter() - start

    @contextmanager
    def checkpointing(self) -> Iterator[None]:
        """A checkpoint is saved; its time goes into the next step's ``checkpoint_s``."""
        start = time.perf_counter()
        self.checkpoint_in_progress = True
        try:
            yield
        finally:
            self.checkpoint_in_progress = False
        self._checkpoint_s += time.perf_counter() - start

    def log_timeline(self, version: int) -> None:
        """One ``timeline.jsonl`` sample: what each component is doing now."""
        sample = timeline_sample(
            self.now(),
            self.engine.stats(),
            trainer_busy=self.trainer_busy,
            checkpointing=self.checkpoint_in_progress,
            reward_in_flight=self.rewards_in_flight,
            buffer_groups=len(self.buffer),
            running_groups=self.gate.running,
            version=version,
            generating_samples=self.gate.generating,
        )
        self.rundir.log_timeline(sample)

    # ------------------------------------------------------------------ the step
    def step_trained(
        self, step: int, groups: list[Group], samples: list[TrainSample], result: TrainStepResult
    ) -> dict[str, Any]:
        """The step is over (its update applied, or skipped as non-finite): its groups' fate into the ledger,
        the counters, and its ``metrics.jsonl`` line (returned, so that the caller may add evaluation)."""
        staleness = [step - g.min_version for g in groups]
        for group in groups:
            self._open.pop(group.prompt.prompt_id, None)
            if result.applied:
                self._log_group(group, trained_step=step, dropped=None, status="trained", tokenizer=self.tokenizer)
            else:  # a non-finite loss or gradient: the update was not applied
                self._log_group(group, trained_step=None, dropped="non_finite_step", status="skipped", step=step)
        trained_tokens = sum(len(s.token_ids) for s in samples)
        if result.applied:
            self.state.staleness_hist.update(staleness)
            self.state.max_staleness_seen = max(self.state.max_staleness_seen, *staleness)
            self.state.trained_tokens += trained_tokens
            self.state.trained_samples += len(samples)
        else:
            self.state.skipped_steps += 1
        self.state.step += 1
        return step_metrics(self._step_record(step, groups, result, trained_tokens))

    def _step_record(self, step: int, groups: list[Group], result: TrainStepResult, trained_tokens: int) -> StepRecord:
        """The step's ``StepRecord``; the per-step accumulators start again."""
        now, engine_now = time.perf_counter(), self.engine.stats()
        times = StepTimes(
            train_start_s=self._train_start,
            end_s=self.now(),
            wall_s=now - self._last_time,
            wait_s=self._wait_s,
            train_s=self._train_s,
            sync_s=self._sync_s,
            checkpoint_s=self._checkpoint_s,
        )
        record = StepRecord(
            step=step,
            groups=groups,
            result=result,
            trained_tokens=trained_tokens,
            times=times,
            engine_before=self._last_engine,
            engine_after=engine_now,
            generated_during_train=self._generated_during_train,
            state=self.state,
            buffer_groups=len(self.buffer),
            running_groups=self.gate.running,
            reward_latency_s=self._reward_latency,
            rollout_rewards=self._rollout_rewards,
        )
        self._reward_latency, self._rollout_rewards, self._checkpoint_s = [], [], 0.0
        self._last_time, self._last_engine = now, engine_now
        return record

    def log_step(self, metrics: dict[str, Any]) -> None:
        """Write the step's ``metrics.jsonl`` line and move the progress bar."""
        self.rundir.log_step(metrics)
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(
                reward=f"{metrics['reward']:.2f}",
                stale=f"{metrics['staleness_mean']:.1f}",
                tok_s=f"{metrics['trained_tokens_per_s']:.0f}",
            )
        if not metrics["applied"]:
            self.note(f"step {metrics['step']}: non-finite loss or gradient, update skipped (ledger: status=skipped)")
