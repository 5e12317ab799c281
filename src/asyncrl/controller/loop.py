"""The asynchronous RL controller: admission, rollouts, batching, training, weight sync.

::

      PromptSource ──next()──► admit loop ──(StalenessGate.capacity(v) > 0)──► episode task
                                   ▲                                      (engine.generate_group
                                   │ wake                                   + score; in flight)
                                   │                                               │ Group
                                   │                        filtered ◄─(all rewards equal)─┤
                                   │                        (ledger)                       ▼
      engines ◄── update_weights(v+1) ◄── train loop ◄── take_fresh(step, η) ◄── GroupBuffer
      (abort | keep, in flight)          (trainer thread:    (stale → dropped,
                                          prox + PPO step)    ledger)

Generation never waits for training: the engine decodes in its own thread, the trainer steps
in another (``run_in_executor``), and this asyncio loop only moves prompts, groups and weights.
A training step i starts from version i and publishes version i + 1 (DESIGN §7); the new
weights reach the engine in flight. With ``max_staleness = 0`` the gate admits one batch per
version and the same code trains synchronously.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from asyncrl.config import Config
from asyncrl.controller.buffer import GroupBuffer, groups_to_samples
from asyncrl.controller.rundir import RunDir
from asyncrl.controller.staleness import StalenessGate
from asyncrl.data.prompts import PromptSource
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.workflow import ScoreFn, run_episode
from asyncrl.types import Group, Prompt, TrainBatch


@dataclass
class ControllerState:
    """What the controller counts over a run (also what a checkpoint saves)."""

    step: int = 0
    trained_tokens: int = 0
    trained_samples: int = 0
    filtered_groups: int = 0
    stale_groups: int = 0
    reward_failures: int = 0
    skipped_steps: int = 0
    max_staleness_seen: int = 0
    staleness_hist: Counter = field(default_factory=Counter)


class Controller:
    """Runs the asynchronous loop of one training run (see the module docstring)."""

    def __init__(
        self,
        cfg: Config,
        engine: Any,
        trainer: Any,
        source: PromptSource,
        score: ScoreFn,
        rundir: RunDir,
        *,
        tokenizer: Any = None,
        stop_token_ids: tuple[int, ...] = (),
    ) -> None:
        self.cfg = cfg
        self.engine = engine
        self.trainer = trainer
        self.source = source
        self.score = score
        self.rundir = rundir
        self.tokenizer = tokenizer
        c = cfg.controller
        self.gate = StalenessGate(c.batch_size, c.max_staleness, c.max_concurrent)
        self.buffer = GroupBuffer()
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
        self._wake_admit = asyncio.Event()
        self._wake_train = asyncio.Event()
        self._stopping = False
        self._errors: list[BaseException] = []
        self._reward_latency: list[float] = []
        self._scoring = 0
        self._training = False
        self._run_start = time.perf_counter()

    # ------------------------------------------------------------------ admission and episodes
    async def _admit_loop(self) -> None:
        while not self._stopping:
            capacity = self.gate.capacity(self.published_version)
            for _ in range(capacity):
                prompt = self.source.next()
                self.gate.on_admit()
                version = self.published_version
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

    async def _timed_score(self, prompt: Prompt, completion: Any) -> tuple[float, str | None]:
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
            stats = self.engine.stats()
            self.rundir.log_timeline(
                {
                    "t": time.perf_counter() - self._run_start,
                    "engine_running": stats.get("running_samples", 0.0),
                    "engine_generated_tokens": stats.get("generated_tokens", 0.0),
                    "trainer_busy": self._training,
                    "reward_in_flight": self._scoring,
                    "buffer_groups": len(self.buffer),
                    "running_groups": self.gate.running,
                    "version": self.published_version,
                }
            )
            await asyncio.sleep(period_s)

    async def _episode(self, prompt: Prompt, version: int) -> None:
        try:
            group = await run_episode(
                self.engine, prompt, self.sampling, self.cfg.rollout.group_size, self._timed_score, version
            )
        except asyncio.CancelledError:
            self.gate.on_cancel()
            raise
        except BaseException:
            self.gate.on_cancel()
            raise
        reason = self._filter_reason(group)
        if reason is None:
            self.gate.on_finish(accepted=True)
            self.buffer.put(group)
            self._wake_train.set()
        else:
            self.gate.on_finish(accepted=False)
            self.state.filtered_groups += 1
            self.rundir.log_group(group, trained_step=None, dropped=reason, status="filtered")
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
    async def _next_batch(self, step: int) -> list[Group]:
        c = self.cfg.controller
        while True:
            if self._errors:
                raise RuntimeError("an episode failed") from self._errors[0]
            fresh, stale = self.buffer.take_fresh(step, c.max_staleness, c.batch_size)
            for group in stale:
                self.gate.on_drop_accepted()
                self.state.stale_groups += 1
                self.rundir.log_group(group, trained_step=None, dropped="stale", status="stale")
            if len(fresh) == c.batch_size:
                return fresh
            for group in reversed(fresh):  # not enough yet: put them back, oldest first
                self.buffer._groups.appendleft(group)
            if stale:
                self._wake_admit.set()
            self._wake_train.clear()
            await self._wake_train.wait()

    async def _train_loop(self, executor: ThreadPoolExecutor, bar: tqdm) -> None:
        loop = asyncio.get_running_loop()
        c = self.cfg.controller
        run_start = self._run_start
        last_time = time.perf_counter()
        last_engine = self.engine.stats()
        while self.state.step < c.total_steps:
            step = self.state.step
            t_wait = time.perf_counter()
            groups = await self._next_batch(step)
            wait_s = time.perf_counter() - t_wait
            samples = groups_to_samples(groups, self.cfg.algo)
            gen_before = self.engine.stats()["generated_tokens"]
            t_train = time.perf_counter()
            self._training = True
            try:
                result = await loop.run_in_executor(executor, self.trainer.train_step, TrainBatch(tuple(samples), step))
            finally:
                self._training = False
            train_s = time.perf_counter() - t_train
            gen_during = self.engine.stats()["generated_tokens"] - gen_before
            t_sync = time.perf_counter()
            update = await loop.run_in_executor(executor, self.trainer.export_weights)
            await self.engine.update_weights(update)
            sync_s = time.perf_counter() - t_sync
            self.published_version = result.version
            self._wake_admit.set()

            staleness = [step - g.min_version for g in groups]
            for g in groups:
                self.rundir.log_group(g, trained_step=step, dropped=None, status="trained", tokenizer=self.tokenizer)
            self.state.staleness_hist.update(staleness)
            self.state.max_staleness_seen = max(self.state.max_staleness_seen, *staleness)
            trained_tokens = sum(len(s.token_ids) for s in samples)
            self.state.trained_tokens += trained_tokens
            self.state.trained_samples += len(samples)
            self.state.skipped_steps += 0 if result.applied else 1
            self.state.step += 1

            now = time.perf_counter()
            engine_now = self.engine.stats()
            wall = now - last_time
            rewards = [r for g in groups for r in g.rewards]
            interruptions = [comp.num_interruptions for g in groups for comp in g.completions]
            latency = sorted(self._reward_latency)
            self._reward_latency.clear()
            record: dict[str, Any] = {
                "step": step,
                "version": result.version,
                "time_s": now - run_start,
                "train_start_s": t_train - run_start,
                "reward": sum(rewards) / len(rewards),
                "accuracy": sum(1 for r in rewards if r >= 1.0) / len(rewards),
                "response_len": sum(len(comp.output_ids) for g in groups for comp in g.completions) / len(rewards),
                "trained_tokens": trained_tokens,
                "trained_tokens_per_s": self.state.trained_tokens / (now - run_start),
                "generated_tokens_per_s": (engine_now["generated_tokens"] - last_engine["generated_tokens"]) / wall,
                "generated_tokens_during_train": gen_during,
                "engine_busy_frac": min(1.0, (engine_now["busy_s"] - last_engine["busy_s"]) / wall),
                "trainer_busy_frac": min(1.0, (train_s + sync_s) / wall),
                "wait_for_batch_s": wait_s,
                "train_step_s": train_s,
                "weight_sync_s": sync_s,
                "staleness_mean": sum(staleness) / len(staleness),
                "staleness_max": max(staleness),
                "staleness_hist": dict(Counter(staleness)),
                "interruptions_per_sample": sum(interruptions) / len(interruptions),
                "buffer_groups": len(self.buffer),
                "running_groups": self.gate.running,
                "filtered_groups_total": self.state.filtered_groups,
                "stale_groups_total": self.state.stale_groups,
                "reward_latency_p50_s": latency[len(latency) // 2] if latency else 0.0,
                "reward_latency_p99_s": latency[min(len(latency) - 1, int(0.99 * len(latency)))] if latency else 0.0,
                "applied": result.applied,
            }
            record.update({k: v for k, v in result.metrics.items() if k not in record})
            self.rundir.log_step(record)
            last_time, last_engine = now, engine_now
            bar.update(1)
            bar.set_postfix(
                reward=f"{record['reward']:.2f}",
                stale=f"{record['staleness_mean']:.1f}",
                tok_s=f"{record['trained_tokens_per_s']:.0f}",
            )
            if not math.isfinite(record.get("loss", 0.0)) or not result.applied:
                tqdm.write(f"step {step}: non-finite loss or gradient, update skipped")

    async def run(self) -> ControllerState:
        """Train for ``controller.total_steps`` steps; returns the run's counters."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asyncrl-trainer")
        bar = tqdm(
            total=self.cfg.controller.total_steps,
            initial=self.state.step,
            desc="rl",
            disable=not self.cfg.run.progress,
            dynamic_ncols=True,
        )
        self._run_start = time.perf_counter()
        admit = asyncio.create_task(self._admit_loop())
        sampler = asyncio.create_task(self._sample_timeline())
        try:
            await self._train_loop(executor, bar)
        finally:
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
