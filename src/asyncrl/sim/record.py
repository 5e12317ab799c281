"""What a simulated run records, in the schema of a real run directory.

Owns ``Recorder``: the timeline (``controller.metrics.timeline_sample`` itself, fed the engines'
pooled counters as ``EnginePool.stats`` sums them), one ``metrics.jsonl`` record per training step
(the keys of ``controller.metrics.step_metrics`` that a simulation can fill), the ledger rows of
finished groups (per sample, when the run is small enough to keep them) and the run's counters.

The timeline keeps about ``scenario.timeline_lines`` samples: the period grows with the projected
length of the run, and when the timeline is full every other sample is dropped and the period
doubles. Engines commit their work lazily (``sim.engine``): with up to ``EXACT_ENGINES`` engines
every sample brings them to its time first; with more, only the samples at t = 0, at the end of the
warm-up step (where the steady-state window opens) and at the end are exact, and the others show
counters up to each engine's last event (seconds behind at most; the run's own figures come from
exact integrals, not from these samples).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

from asyncrl.controller.buffer import GroupBuffer
from asyncrl.controller.metrics import slot_occupancy, timeline_sample
from asyncrl.controller.staleness import StalenessGate
from asyncrl.sim.engine import SimEngine
from asyncrl.sim.groups import SimGroup, simulated
from asyncrl.sim.pool import EngineTotals
from asyncrl.sim.scenario import Scenario


class SimulatorState(Protocol):
    """What the recorder reads of the simulator (``sim.loop.Simulator``), so that neither module imports
    the other's class both ways."""

    s: Scenario
    gate: StalenessGate
    buffer: GroupBuffer
    totals: EngineTotals
    engines: list[SimEngine]
    keep_samples: bool
    now: float
    published: int
    in_flight: dict[int, SimGroup]
    scoring: int
    gid: int
    n_events: int

    @property
    def training(self) -> bool: ...

    def sync_engines(self, now: float) -> None: ...


EXACT_ENGINES = 64
"""Up to this many engines, every timeline sample and step record brings all engines to its time."""


class Recorder:
    def __init__(self, sim: SimulatorState) -> None:
        self.sim = sim
        self.period = sim.s.timeline_period_s
        self.exact = len(sim.engines) <= EXACT_ENGINES
        total = sim.s.total_steps
        self.warmup_steps = sim.s.warmup_steps if sim.s.warmup_steps >= 0 else total // 10
        self.timeline: list[dict[str, Any]] = []
        self.metrics: list[dict[str, Any]] = []
        self.ledger: list[dict[str, Any]] = []
        self.staleness: Counter[int] = Counter()
        self.statuses: Counter[str] = Counter()
        """Groups by final status (trained, filtered, stale)."""
        self.finished_tokens: Counter[str] = Counter()
        """Response tokens of the samples of finished groups, by status."""
        self.interrupts = 0
        self.trained_tokens = 0
        self.trained_samples = 0
        self.train_busy_s = 0.0
        self.sync_busy_s = 0.0
        self._train_start = 0.0
        self._train_end = 0.0
        self._tokens = 0
        self._last_time = 0.0
        self._last_engine = self.engine_stats(0.0, sync=True)
        self._wait_from = 0.0

    # ------------------------------------------------------------------ engines
    def engine_stats(self, t: float, sync: bool) -> dict[str, float]:
        """The engines' counters summed at time ``t`` (with ``sync``, every engine brought to ``t``
        first; else as of each engine's last event)."""
        sim = self.sim
        if sync:
            sim.sync_engines(t)
        tot = sim.totals
        # a prefill or a weight load already charged past t (only counted where the engines are current)
        ahead = sum(eng.t - t for eng in sim.engines if eng.t > t) if sync else 0.0
        return {
            "generated_tokens": float(tot.generated),
            "decode_tokens": float(tot.decode_tokens),
            "decode_steps": float(tot.decode_steps),
            "decode_s": tot.decode_s,
            "prefill_s": tot.prefill_s,
            "prefill_tokens": float(tot.prefill_tokens),
            "update_s": tot.update_s,
            "busy_s": max(0.0, tot.decode_s + tot.prefill_s + tot.update_s - ahead),
            "running_samples": float(tot.running),
            "waiting_requests": float(tot.waiting),
            "max_slots": float(sim.s.slots * len(sim.engines)),
            "engines": float(len(sim.engines)),
        }

    def sample(self, t: float, exact: bool = False) -> None:
        """One timeline line at time ``t`` (``exact``: engines brought to ``t`` whatever their number)."""
        sim = self.sim
        line = timeline_sample(
            t,
            self.engine_stats(t, sync=exact or self.exact),
            trainer_busy=sim.training,
            checkpointing=False,
            reward_in_flight=sim.scoring,
            buffer_groups=len(sim.buffer),
            running_groups=sim.gate.running,
            version=sim.published,
            generating_samples=sim.gate.generating,
        )
        if self.timeline and t <= self.timeline[-1]["t"]:
            self.timeline[-1] = line
            return
        self.timeline.append(line)
        if len(self.timeline) > sim.s.timeline_lines:
            last = self.timeline[-1]
            self.timeline = self.timeline[::2]
            if self.timeline[-1] is not last:
                self.timeline.append(last)
            self.period *= 2

    # ------------------------------------------------------------------ groups and steps
    def finished(self, grp: SimGroup, step: int | None = None) -> None:
        """A group's fate is known: filtered, stale (at ``step``) or trained (at ``step``)."""
        self.statuses[grp.status] += 1
        self.finished_tokens[grp.status] += sum(grp.lengths)
        if grp.samples is None:
            return
        trained = grp.status == "trained"
        dropped = None if trained else ("equal_rewards" if grp.status == "filtered" else grp.status)
        self.ledger.append(
            {  # its admission, as the controller's ledger has it (the admission order)
                "prompt_id": str(grp.gid),
                "sample_idx": None,
                "status": "admitted",
                "stream_index": grp.gid - 1,
                "start_version": grp.admit_version,
            }
        )
        for idx, (length, intr, version) in enumerate(grp.samples):
            self.ledger.append(
                {
                    "prompt_id": str(grp.gid),
                    "sample_idx": idx,
                    "status": grp.status,
                    "start_version": grp.admit_version,
                    "min_version": grp.min_version,
                    "max_version": version,
                    "response_len": length,
                    "num_interruptions": intr,
                    "trained_step": step if trained else None,
                    "dropped": dropped,
                    **({} if grp.bound is None else {"max_staleness": grp.bound}),
                }
            )

    def train_start(self, now: float, tokens: int) -> None:
        self._train_start = now
        self._tokens = tokens

    def train_end(self, now: float) -> None:
        self._train_end = now

    def step_end(self, now: float, step: int, groups: list[SimGroup]) -> None:
        """``metrics.jsonl``'s line for training step ``step`` (published at ``now``)."""
        train_s = self._train_end - self._train_start
        sync_s = now - self._train_end
        self.train_busy_s += train_s
        self.sync_busy_s += sync_s
        staleness = [step - g.min_version for g in groups]
        self.staleness.update(staleness)
        samples = sum(len(g.lengths) for g in groups)
        self.trained_tokens += self._tokens
        self.trained_samples += samples
        self.interrupts += sum(g.interrupts for g in groups)
        for g in groups:
            self.finished(g, step)
        window_opens = step + 1 == self.warmup_steps
        engine = self.engine_stats(now, sync=self.exact or window_opens)
        if window_opens:
            self.sample(now, exact=True)
        projected_end = now * self.sim.s.total_steps / (step + 1)
        self.period = max(self.period, projected_end / self.sim.s.timeline_lines)
        wall = max(now - self._last_time, 1e-12)
        busy = engine["busy_s"] - self._last_engine["busy_s"]
        sim = self.sim
        self.metrics.append(
            {
                "step": step,
                "version": step + 1,
                "time_s": now,
                "train_start_s": self._train_start,
                "reward": None,
                "accuracy": None,
                "rollout_reward": None,
                "rollout_accuracy": None,
                "response_len": sum(sum(g.lengths) for g in groups) / samples,
                "trained_tokens": self._tokens,
                "trained_tokens_per_s": self.trained_tokens / max(now, 1e-12),
                "trained_tokens_per_s_step": self._tokens / wall,
                "generated_tokens_per_s": (engine["generated_tokens"] - self._last_engine["generated_tokens"]) / wall,
                "engine_busy_frac": min(1.0, busy / (wall * len(sim.engines))),
                "engine_slot_occupancy": slot_occupancy(self._last_engine, engine),
                "trainer_busy_frac": min(1.0, (train_s + sync_s) / wall),
                "step_wall_s": wall,
                "wait_for_batch_s": max(0.0, self._train_start - self._last_time),
                "train_step_s": train_s,
                "weight_sync_s": sync_s,
                "checkpoint_s": 0.0,
                "staleness_mean": sum(staleness) / len(staleness),
                "staleness_max": max(staleness),
                "staleness_hist": dict(Counter(staleness)),
                "interruptions_per_sample": sum(g.interrupts for g in groups) / samples,
                "buffer_groups": len(sim.buffer),
                "running_groups": sim.gate.running,
                "engine_waiting_requests": engine["waiting_requests"],
                "admitted_total": sim.gid,
                "filtered_groups_total": self.statuses["filtered"],
                "stale_groups_total": self.statuses["stale"],
                "applied": True,
                "simulated": True,
            }
        )
        self._last_time, self._last_engine = now, engine

    # ------------------------------------------------------------------ the end
    def finish(self, wall_s: float) -> dict[str, Any]:
        """Everything the run produced (``sim.output.summarise`` reads it); groups still buffered
        are ``unused``, groups still generating or scoring ``in_flight``."""
        sim = self.sim
        unused = [simulated(r) for r in sim.buffer.drain()]
        for grp in unused:
            grp.status = "unused"
            self.finished(grp)
        for grp in sim.in_flight.values():
            self.statuses["in_flight"] += 1
            if grp.samples is not None:
                self.ledger.append(
                    {
                        "prompt_id": str(grp.gid),
                        "sample_idx": None,
                        "status": "in_flight",
                        "start_version": grp.admit_version,
                    }
                )
        return {
            "metrics": self.metrics,
            "timeline": self.timeline,
            "ledger": self.ledger if sim.keep_samples else None,
            "staleness": dict(self.staleness),
            "statuses": dict(self.statuses),
            "finished_tokens": dict(self.finished_tokens),
            "engine": self.engine_stats(sim.now, sync=True),
            "running_s": sim.totals.running_s,
            "trained_tokens": self.trained_tokens,
            "trained_samples": self.trained_samples,
            "interrupts": self.interrupts,
            "train_busy_s": self.train_busy_s,
            "sync_busy_s": self.sync_busy_s,
            "end_s": sim.now,
            "admitted": sim.gid,
            "events": sim.n_events,
            "wall_s": wall_s,
        }
