"""The simulated asynchronous loop: the controller's own admission and batch rules over simulated time.

Owns ``Simulator``: a discrete-event simulation of ``controller.loop.Controller`` in which the
engines (``sim.engine``), the trainer, weight sync and rewards take the time a cost profile says.
What decides *what* happens is the controller's own code, imported and driven as the loop drives it:

- admission: ``controller.staleness.StalenessGate.capacity(published_version, buffered)`` groups
  are admitted whenever the loop would wake its admission (a group finished, a sample ended under
  the ``samples`` unit, a batch was taken, stale groups were dropped, new weights were published),
  with ``on_admit`` / ``on_finish`` / ``on_drop_accepted`` and ``EpisodeSamples`` keeping the counts;
- batching: ``controller.buffer.GroupBuffer.take_fresh(step, max_staleness, batch_size)`` on real
  ``types.Group`` records carrying each group's oldest token version (``sim.groups.BufferedGroup``),
  so a stale group is dropped (and its budget given back) when the controller would drop it (one
  shortcut: a stale group arriving while the trainer waits is dropped without the O(buffer) call
  that would drop exactly it);
- the step: train, then publish (``inflight``: export, then every engine loads the weights between
  two steps, in ``abort`` or ``keep`` mode; ``drain``: stop admitting and wait until no group runs);
  version v + 1 is published at the end of step v and the next step begins;
- adaptive admission (``scenario.adaptive``): ``controller.adaptive.AdaptiveAdmission`` itself, given
  each simulated step's metrics line, sets the gate's η_t and mark for the next admissions, and each
  group is buffered with the η_t of its admission (``GroupBuffer.put(group, bound)``), as in the loop.

What is modelled and what is not: ``docs/simulator.md``.
"""

from __future__ import annotations

import gc
import heapq
import random
import time
from typing import Any

from asyncrl.controller.adaptive import AdaptiveAdmission, AdaptiveLimits
from asyncrl.controller.buffer import GroupBuffer
from asyncrl.controller.staleness import EpisodeSamples, StalenessGate, group_bound, must_wait_for_stragglers
from asyncrl.sim.engine import SimEngine
from asyncrl.sim.groups import SimGroup, buffer_record, simulated
from asyncrl.sim.pool import EngineTotals, Router
from asyncrl.sim.profile import CostProfile
from asyncrl.sim.record import Recorder
from asyncrl.sim.scenario import Scenario
from asyncrl.sim.workload import LengthSampler
from asyncrl.types import Group

ENGINE, SCORED, TRAINED, EXPORTED, SYNCED, SAMPLE = range(6)
IDLE, TRAINING, SYNCING = range(3)


class Simulator:
    """One simulated run of ``scenario`` under ``profile`` (see the module docstring)."""

    def __init__(self, scenario: Scenario, profile: CostProfile) -> None:
        e = profile.engine
        s = scenario.resolved(e.devices, profile.trainer.devices_per_rank, e.max_slots)
        self.s, self.profile = s, profile
        self.gate = StalenessGate(
            s.batch_size,
            s.max_staleness,
            s.max_concurrent,
            high_water=s.high_water_batches * s.batch_size,
            high_water_unit=s.high_water_unit,
            group_size=s.group_size,
        )
        self.adaptive = (
            AdaptiveAdmission(AdaptiveLimits(s.max_staleness), self.gate, s.batch_size) if s.adaptive else None
        )
        self.buffer = GroupBuffer()
        self.reports = s.per_sample_reports
        self.totals = EngineTotals()
        self.engines = [SimEngine(i, e, s.slots, self._sample_end, self.totals, self.reports) for i in range(s.engines)]
        self.router = Router(s.engines)
        self.lengths = LengthSampler(
            s.lengths,
            s.group_size,
            s.max_new_tokens,
            median=s.length_median,
            sigma=s.length_sigma,
            within_sigma=s.length_within_sigma,
            ledger=s.ledger or None,
            ordered=s.ledger_ordered,
            seed=s.seed,
        )
        self.rng = random.Random(s.seed)
        self.reward_s = s.reward_latency_s if s.reward_latency_s >= 0 else profile.reward.latency_s
        self.abort = s.interrupt_mode == "abort"
        self.keep_samples = s.total_steps * s.batch_size * s.group_size <= s.ledger_rows
        self.events: list[tuple[float, int, int, Any, int]] = []
        self._seq = 0
        self.now = 0.0
        self.step = 0
        self.published = 0
        self.trainer = IDLE
        self.draining = False
        self.waiting_drain = False
        self.wake_admit = True
        self.in_flight: dict[int, SimGroup] = {}
        self.scoring = 0
        self.gid = 0
        self.batch: list[Group] = []
        self.rec = Recorder(self)
        self.n_events = 0

    @property
    def training(self) -> bool:
        """Inside a training step (what the real timeline's ``trainer_busy`` says)."""
        return self.trainer == TRAINING

    # ------------------------------------------------------------------ events
    def _push(self, t: float, kind: int, obj: Any = None, token: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, obj, token))

    def _reschedule(self, eng: SimEngine) -> None:
        if eng.run:
            self._push(eng.next_t, ENGINE, eng, eng.token)

    def sync_engines(self, now: float) -> None:
        """Bring every engine to ``now`` (their lazily committed counters become current)."""
        for eng in self.engines:
            if eng.advance(now):
                eng.schedule()
                self._reschedule(eng)

    def run(self) -> dict[str, Any]:
        """Simulate until ``total_steps`` training steps have published; returns the recorder's
        raw result (``sim.output.summarise`` turns it into a ``SimResult``)."""
        wall0, cpu0 = time.perf_counter(), time.process_time()
        gc_was_on = gc.isenabled()
        gc.disable()  # millions of small tuples and no reference cycles: the collector only costs time
        try:
            raw = self._run(wall0)
        finally:
            if gc_was_on:
                gc.enable()
        raw["cpu_s"] = time.process_time() - cpu0
        return raw

    def _run(self, wall0: float) -> dict[str, Any]:
        self.rec.sample(0.0, exact=True)
        self._push(self.rec.period, SAMPLE)
        self._admit()
        events = self.events
        while self.step < self.s.total_steps:
            if not events:
                raise RuntimeError(f"simulation stalled at step {self.step} (t={self.now:.3f} s): no event left")
            t, _, kind, obj, token = heapq.heappop(events)
            self.now = t
            self.n_events += 1
            if kind == ENGINE:
                if token != obj.token:
                    continue
                obj.fire()
                self._reschedule(obj)
            elif kind == SCORED:
                self._scored(obj)
            elif kind == SAMPLE:
                self.rec.sample(t)
                self._push(t + self.rec.period, SAMPLE)
            elif kind == TRAINED:
                self._trained()
            elif kind == EXPORTED:
                self._exported()
            else:
                self._synced()
            if self.wake_admit:
                self._admit()
        self.rec.sample(self.now, exact=True)
        return self.rec.finish(time.perf_counter() - wall0)

    # ------------------------------------------------------------------ admission and episodes
    def _admit(self) -> None:
        self.wake_admit = False
        if self.draining:
            return
        s, gate, now = self.s, self.gate, self.now
        changed: dict[SimEngine, None] = {}  # insertion-ordered: the run is deterministic
        for _ in range(gate.capacity(self.published, len(self.buffer))):
            gate.on_admit()
            self.gid += 1
            lengths = self.lengths.next_group()
            grp = SimGroup(self.gid, s.prompt_len, lengths, self.published)
            if s.ledger_filter:
                grp.rejected = bool(self.lengths.replayed_filtered)
            if self.adaptive is not None:
                grp.bound = gate.max_staleness
            grp.live = EpisodeSamples(gate)
            if self.reports:
                grp.report = grp.live.attempt()
            if self.keep_samples:
                grp.samples = []
            i = self.router.pick()
            self.router.add(i, s.group_size)
            grp.engine = i
            self.in_flight[grp.gid] = grp
            eng = self.engines[i]
            if eng.submit(grp, list(lengths), now):
                changed[eng] = None
        for eng in changed:  # one new event per engine for the whole burst
            eng.schedule()
            self._reschedule(eng)

    def _sample_end(self, grp: SimGroup, t: float, length: int, interrupts: int) -> None:
        """An engine sampled the last token of one of ``grp``'s samples at time ``t`` (its counts
        are updated: ``sim.engine.SampleEnd``)."""
        if grp.samples is not None:
            grp.samples.append((length, interrupts, grp.max_version))
        if grp.report is not None:
            grp.report(grp.left)
            if self.s.high_water_unit == "samples":
                self.wake_admit = True
        if grp.left == 0:
            grp.finish_t = t
            self.router.add(grp.engine, -self.s.group_size)
            self.scoring += len(grp.lengths)
            self._push(max(self.now, t + self.reward_s), SCORED, grp)

    def _scored(self, grp: SimGroup) -> None:
        """Rewards are in: the episode ends (``Controller._episode``)."""
        self.scoring -= len(grp.lengths)
        del self.in_flight[grp.gid]
        grp.live.close()
        self.wake_admit = True
        if self._rejected(grp):
            self.gate.on_finish(accepted=False)
            grp.status = "filtered"
            self.rec.finished(grp)
        elif self.trainer == IDLE and self.step - grp.min_version > self._bound(grp):
            # The waiting trainer's take_fresh would drop it at once, so skip the O(buffer) call (with
            # stragglers=wait other stale groups may still be buffered: the next take_fresh drops them).
            self.gate.on_finish(accepted=True)
            self.gate.on_drop_accepted()
            grp.status = "stale"
            self.rec.finished(grp, step=self.step)
        else:
            self.gate.on_finish(accepted=True)
            self.buffer.put(buffer_record(grp), grp.bound)
        if self.trainer == IDLE and len(self.buffer) >= self.s.batch_size:
            self._next_batch()  # a new batch, or (stragglers=wait) the group the trainer waited for ended
        if self.waiting_drain and self.gate.running == 0:
            self._export()

    def _rejected(self, grp: SimGroup) -> bool:
        """The filter's verdict: the replayed group's own (``ledger_filter``), else a ``filter_prob`` coin."""
        if grp.rejected is not None:
            return grp.rejected
        return self.s.filter_prob > 0 and self.rng.random() < self.s.filter_prob

    def _bound(self, grp: SimGroup) -> int:
        """The staleness bound ``grp`` is trained within (its admission's η_t under adaptive admission)."""
        return group_bound(grp.bound, self.s.max_staleness)

    # ------------------------------------------------------------------ training and weight sync
    def _next_batch(self) -> None:
        """``Controller._next_batch``: the oldest fresh batch, stale groups dropped; with ``stragglers=wait``
        the groups due soonest, after waiting while a running group must be in this batch to be trained in
        time (``staleness.must_wait_for_stragglers``)."""
        if self.step >= self.s.total_steps:
            return
        wait = self.s.stragglers == "wait"
        if wait and must_wait_for_stragglers(
            self.step,
            self.s.batch_size,
            self.buffer.last_steps(self.s.max_staleness),
            (g.admit_version + self._bound(g) for g in self.in_flight.values()),
        ):
            return  # a group still generating must be in this batch: the trainer waits for it
        batch, stale = self.buffer.take_fresh(
            self.step, self.s.max_staleness, self.s.batch_size, nearest_bound_first=wait
        )
        for record in stale:
            self.gate.on_drop_accepted()
            grp = simulated(record)
            grp.status = "stale"
            self.rec.finished(grp, step=self.step)
        if stale:
            self.wake_admit = True
        if not batch:
            return
        self.wake_admit = True
        self.batch = batch
        self.trainer = TRAINING
        tokens = sum(simulated(r).tokens for r in batch)
        self.rec.train_start(self.now, tokens)
        self._push(self.now + self.profile.trainer.step_s(tokens, self.s.trainer_ranks), TRAINED)

    def _trained(self) -> None:
        self.trainer = SYNCING
        self.rec.train_end(self.now)
        if self.s.weight_sync == "drain":
            self.draining = True
            if self.gate.running > 0:
                self.waiting_drain = True
                return
        self._export()

    def _export(self) -> None:
        self.waiting_drain = False
        self._push(self.now + self.profile.sync.export_s, EXPORTED)

    def _exported(self) -> None:
        """Every engine loads version step + 1 between two of its steps (``abort`` or ``keep``)."""
        done = self.now
        for eng in self.engines:
            done = max(done, eng.update(self.now, self.step + 1, self.abort))
            self._reschedule(eng)
        self._push(done, SYNCED)

    def _synced(self) -> None:
        """``Controller._train_loop`` after ``_publish``: the new version is live, the step ends."""
        self.published = self.step + 1
        self.draining = False
        self.wake_admit = True
        batch, self.batch = self.batch, []
        groups = [simulated(r) for r in batch]
        for grp in groups:
            grp.status = "trained"
        self.rec.step_end(self.now, self.step, groups)
        if self.adaptive is not None:  # the next admissions' setting, from this step's line
            line = self.rec.metrics[-1]
            line.update(self.adaptive.step(line))
        self.step += 1
        self.trainer = IDLE
        self._next_batch()
