"""A simulated rollout engine: continuous batching over a slot limit, costed by a profile.

Owns ``SimEngine`` (one engine instance) and ``SampleEnd`` (how it reports a sample's end); the
counters of all engines together (``EngineTotals``) and the routing over them (``Router``) live in
``sim.pool``.

The engine follows ``rollout.engine.LocalEngine``'s scheduler: requests wait in a FIFO queue and
their samples join the running batch at a step boundary as slots (and KV capacity) free up; the G
samples of a group share one prefill (a sample that joins later copies the prompt's KV); a join
samples the first token, then every decode step adds one token to every running sample; a sample
of L tokens leaves at the step its last token is sampled. A weight update is applied between two
steps: ``keep`` swaps the weights (samples go on), ``abort`` ends every running sample and
resubmits it as prompt + partial output, re-prefilled under the new weights (AReaL's mode: the
cost is that prefill).

Events are batched. A sample's last step is fixed when it joins (the steps it still needs), so
running samples are kept sorted by it; between two changes of the running set the batch is
constant and the time to any later step is a closed form (``EngineCost.step_s`` is linear in the
contexts, which grow by one token per sequence per step). The engine's next event is its next
sample end when the controller must hear of every sample (one engine reporting each sample) or
when requests wait for a slot; otherwise it is its next *group* end, and the sample ends before
it are committed lazily in one loop. A run costs O(samples log slots) Python work, not O(tokens).
Step counts are exact; a request that arrives mid-step joins at the boundary before it (at most
one step early). With ``EngineCost.slot_prefix_rows`` the step cost is that of ``LocalEngine``'s
slot layout (``sim.layout.SlotLayout``: idle rows and padded attention), again linear between two
changes of the running set.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from typing import Any

from asyncrl.sim.groups import SimGroup
from asyncrl.sim.layout import SlotLayout
from asyncrl.sim.pool import EngineTotals
from asyncrl.sim.profile import EngineCost

SampleEnd = Callable[[SimGroup, float, int, int], None]
"""``(group, time, length, interruptions)`` when a sample's last token was sampled (the engine has
already counted it in ``group.left``, ``interrupts`` and ``max_version``), called for every sample
when the engine reports each one or the group keeps its samples for the ledger, else only for the
group's last sample."""


class SimEngine:
    """One engine (see the module docstring). ``t`` is the engine's clock at step ``steps``."""

    __slots__ = (
        "index",
        "slots",
        "kv_cap",
        "a",
        "b",
        "c",
        "p",
        "update_cost",
        "t",
        "steps",
        "run",
        "groups",
        "ctx",
        "waiting",
        "version",
        "updates",
        "seq",
        "token",
        "next_t",
        "next_step",
        "plan",
        "per_sample",
        "on_end",
        "tot",
        "layout",
    )

    def __init__(
        self, index: int, cost: EngineCost, slots: int, on_end: SampleEnd, totals: EngineTotals, per_sample: bool
    ) -> None:
        self.index = index
        self.slots = slots
        self.kv_cap = cost.kv_capacity_tokens
        self.a, self.b, self.c = cost.decode_base_s, cost.decode_per_seq_s, cost.decode_per_ctx_token_s
        self.p = cost.prefill_per_token_s
        self.update_cost = cost.update_s
        self.on_end = on_end
        self.tot = totals
        self.per_sample = per_sample
        """The controller hears of every sample's end: each one is an event."""
        self.layout = SlotLayout(slots, self.a, self.b, self.c) if cost.slot_prefix_rows else None
        """The slots of the running samples, when the step cost is ``LocalEngine``'s layout's."""
        self.t = 0.0
        self.steps = 0
        self.run: list[tuple[int, int, SimGroup, int, int, int]] = []
        """Running samples, sorted: (step of its last token, seq, group, its final context = prompt +
        length, updates at its join, its slot (-1 without ``layout``))."""
        self.groups: list[tuple[int, int, SimGroup]] = []
        """Heap of (last step, seq, group) of fully joined groups (outdated entries skipped)."""
        self.ctx = 0
        """Context tokens (prompt + generated) of all running samples at ``steps``."""
        self.waiting: deque[list[Any]] = deque()
        """[group, lengths still to join, tokens already generated, prefilled, updates at first join]."""
        self.version = 0
        self.updates = 0
        self.seq = 0
        self.token = 0
        """Bumped whenever the next event changes (older scheduled events are ignored)."""
        self.next_t = math.inf
        self.next_step = -1
        self.plan: tuple[int, int, float, int, int, float, float, int] | None = None
        """(token, samples ending, time, step, context, decode s, running s, tokens) at ``next_step``,
        computed by ``schedule``; None once the engine's state changed since."""

    # ------------------------------------------------------------------ time arithmetic
    def _span(self, k: int, n: int, ctx: int) -> float:
        """Seconds of ``k`` decode steps of ``n`` sequences holding ``ctx`` context tokens at the first
        (the running samples' with a ``layout``)."""
        if self.layout is not None:
            first, growth = self.layout.cost(self.steps)
            return k * first + 0.5 * growth * k * (k - 1)
        return k * (self.a + self.b * n + self.c * ctx) + 0.5 * self.c * n * k * (k - 1)

    def _steps_within(self, dt: float, n: int) -> int:
        """The most whole decode steps of the current batch that fit in ``dt`` seconds."""
        if dt <= 0.0:
            return 0
        if self.layout is not None:
            first, growth = self.layout.cost(self.steps)
            half = 0.5 * growth
        else:
            first = self.a + self.b * n + self.c * self.ctx
            half = 0.5 * self.c * n
        if half <= 0.0:
            k = int(dt // first)
        else:
            lin = first - half
            k = int((-lin + math.sqrt(lin * lin + 4.0 * half * dt)) / (2.0 * half))
        while k > 0 and self._span(k, n, self.ctx) > dt:
            k -= 1
        while self._span(k + 1, n, self.ctx) <= dt:
            k += 1
        return k

    def _plan(self, step: int) -> float:
        """When the engine reaches ``step`` with the running set as it is (the ends on the way
        included); the state there is kept in ``plan`` so that ``fire`` need not compute it again."""
        t0, s0 = self.t, self.steps
        t, s, n, ctx = t0, s0, len(self.run), self.ctx
        a, b, c = self.a, self.b, self.c
        half = 0.5 * c
        i = sum_e = 0
        sum_t = 0.0
        layout = self.layout
        hidden = []
        for end, _, _, final, _, slot in self.run:
            if end > step:
                break
            if end != s:
                k = end - s
                live = n - i
                if layout is None:
                    t += k * (a + b * live + c * ctx + half * live * (k - 1))
                else:
                    first, growth = layout.cost(s)
                    t += k * first + 0.5 * growth * k * (k - 1)
                ctx += live * k
                s = end
            ctx -= final
            sum_t += t
            sum_e += end
            i += 1
            if layout is not None:  # out of the batch for the rest of the plan (shown again below)
                layout.hide(slot, final - end)
                hidden.append((slot, final - end))
        for slot, u in hidden:
            layout.show(slot, u)  # type: ignore[union-attr]
        rest = n - i  # each sample runs from (t0, s0) to its end, or to the planned step
        running_s = sum_t + rest * t - n * t0
        tokens = sum_e + rest * s - n * s0
        self.plan = (self.token, i, t, s, ctx, t - t0, running_s, tokens)
        return t

    # ------------------------------------------------------------------ committing time
    def _commit(self, step: int, until: float = math.inf) -> None:
        """Decode up to ``step`` (or the last sample end at or before time ``until``), ending the
        samples due on the way; the batch is unchanged between two ends (nothing is admitted)."""
        self.plan = None
        run, tot = self.run, self.tot
        t, s, n, ctx = self.t, self.steps, len(run), self.ctx
        a, b, c = self.a, self.b, self.c
        i = 0
        decode_s = running_s = 0.0
        tokens = steps = 0
        half = 0.5 * c
        updates, version, on_end, every = self.updates, self.version, self.on_end, self.per_sample
        layout = self.layout
        while i < n and run[i][0] <= step:
            end, _, grp, final, upd0, slot = run[i]
            live = n - i
            k = end - s
            if k:
                if layout is None:
                    dt = k * (a + b * live + c * ctx + half * live * (k - 1))
                else:
                    first, growth = layout.cost(s)
                    dt = k * first + 0.5 * growth * k * (k - 1)
                if t + dt > until:
                    break
                t += dt
                decode_s += dt
                running_s += live * dt
                tokens += live * k
                steps += k
                ctx += live * k
                s = end
            ctx -= final
            i += 1
            if layout is not None:
                layout.release(slot, final - end)
            grp.left -= 1
            grp.interrupts += updates - upd0
            if every or grp.left == 0 or grp.samples is not None:
                grp.max_version = version
                self.t = t
                on_end(grp, t, final - grp.prompt_len, updates - upd0)
        if i:
            del run[:i]
            tot.running -= i
        self.t, self.steps, self.ctx = t, s, ctx
        tot.decode_s += decode_s
        tot.running_s += running_s
        tot.decode_tokens += tokens
        tot.generated += tokens
        tot.decode_steps += steps

    def _decode(self, k: int) -> None:
        """``k`` decode steps with no sample ending."""
        self.plan = None
        n = len(self.run)
        dt = self._span(k, n, self.ctx)
        self.t += dt
        self.steps += k
        self.ctx += n * k
        tot = self.tot
        tot.decode_s += dt
        tot.running_s += n * dt
        tot.decode_steps += k
        tot.decode_tokens += n * k
        tot.generated += n * k

    def advance(self, now: float) -> bool:
        """Bring the engine to its last step boundary at or before ``now``, ending what ends on the
        way and admitting into freed slots (returns whether any sample joined: the next event may
        have changed); an idle engine's clock moves to ``now``."""
        joined = False
        while self.run and self.t < now:
            self._commit(self.run[-1][0], now)
            if self.waiting and self._admit():
                joined = True
                continue
            break
        if self.run and self.t < now:
            k = min(self._steps_within(now - self.t, len(self.run)), self.run[0][0] - self.steps - 1)
            if k > 0:
                self._decode(k)
        elif not self.run and self.t < now:
            self.t = now
            self.plan = None
        return joined

    # ------------------------------------------------------------------ the scheduler
    def _admit(self) -> bool:
        """Join waiting samples into free slots (FIFO), charging their prefill; whether any joined."""
        run, waiting = self.run, self.waiting
        free = self.slots - len(run)
        if free <= 0 or not waiting:
            return False
        prefill = joined = 0
        steps, updates = self.steps, self.updates
        ended: list[tuple[SimGroup, int, int]] = []
        added = False
        while waiting and free > 0:
            req = waiting[0]
            grp, lens, done = req[0], req[1], req[2]
            ctx0 = grp.prompt_len + done + 1
            k = min(free, len(lens))
            if self.kv_cap:
                fit = (self.kv_cap - self.ctx) // ctx0
                k = min(k, fit if run else max(1, fit))
                if k <= 0:
                    break
            if not req[3]:
                prefill += grp.prompt_len + done
                req[3] = True
            if req[4] is None:
                req[4] = updates
                if self.version < grp.min_version:
                    grp.min_version = self.version
            upd0 = req[4]
            take = lens[-k:]
            del lens[-k:]
            base, seq = steps - done - 1, self.seq
            self.seq = seq + k
            if base + min(take) <= steps:  # samples whose first token was their last
                ended.extend((grp, length, updates - upd0) for length in take if base + length <= steps)
                take = [length for length in take if base + length > steps]
            if take:
                p = grp.prompt_len
                layout = self.layout
                run.extend(
                    (base + length, seq + j, grp, p + length, upd0, -1 if layout is None else layout.take(p - base))
                    for j, length in enumerate(take, 1)
                )
                self.tot.running += len(take)
                added = True
                self.ctx += ctx0 * len(take)
                last = base + max(take)
                if last > grp.last_end:
                    grp.last_end = last
            grp.pending -= k
            if grp.pending == 0 and grp.last_end >= 0:
                heapq.heappush(self.groups, (grp.last_end, self.seq, grp))
            joined += k
            free -= k
            if not lens:
                waiting.popleft()
                self.tot.waiting -= 1
        self.plan = None
        if added:
            run.sort()
        tot = self.tot
        if prefill:
            dt = prefill * self.p
            self.t += dt
            tot.prefill_s += dt
            tot.running_s += len(run) * dt
            tot.prefill_tokens += prefill
        tot.generated += joined
        for grp, length, intr in ended:
            grp.left -= 1
            grp.interrupts += intr
            grp.max_version = self.version
            self.on_end(grp, self.t, length, intr)
        return joined > 0

    def _next_group_end(self) -> int:
        """The step at which the next fully joined group ends (-1: none)."""
        heap = self.groups
        while heap:
            end, _, grp = heap[0]
            if grp.left > 0 and grp.pending == 0 and end == grp.last_end:
                return end
            heapq.heappop(heap)
        return -1

    def schedule(self) -> None:
        """Recompute the next event (``next_t``, ``next_step``) and invalidate older ones."""
        self.token += 1
        if not self.run:
            self.next_t, self.next_step = math.inf, -1
            return
        step = self.run[0][0]
        if not self.per_sample and not self.waiting:
            step = max(step, self._next_group_end())
        self.next_step = step
        self.next_t = self._plan(step)

    def fire(self) -> None:
        """The scheduled event: decode to it (ending the samples due), admit, reschedule."""
        plan = self.plan
        if plan is not None and plan[0] == self.token:
            self._apply(plan)
        else:
            self._commit(self.next_step)
        if self.waiting:
            self._admit()
        self.schedule()

    def _apply(self, plan: tuple[int, int, float, int, int, float, float, int]) -> None:
        """Reach the planned step: end its ``i`` first samples (all at the planned time: only
        samples ending at the planned step can be a group's last or be reported one by one)."""
        _, i, t, s, ctx, decode_s, running_s, tokens = plan
        run, updates, version, on_end, every = self.run, self.updates, self.version, self.on_end, self.per_sample
        steps = s - self.steps
        self.t, self.steps, self.ctx = t, s, ctx
        layout = self.layout
        for end, _, grp, final, upd0, slot in run[:i]:
            if layout is not None:
                layout.release(slot, final - end)
            grp.left -= 1
            grp.interrupts += updates - upd0
            if every or grp.left == 0 or grp.samples is not None:
                grp.max_version = version
                on_end(grp, t, final - grp.prompt_len, updates - upd0)
        del run[:i]
        tot = self.tot
        tot.running -= i
        tot.decode_s += decode_s
        tot.running_s += running_s
        tot.decode_tokens += tokens
        tot.generated += tokens
        tot.decode_steps += steps

    def submit(self, grp: SimGroup, lengths: list[int], now: float) -> bool:
        """A request for ``lengths`` (samples of ``grp``); whether the next event may have changed
        (the caller then calls ``schedule`` and pushes the new event)."""
        self.waiting.append([grp, lengths, 0, False, None])
        self.tot.waiting += 1
        if len(self.waiting) > 1:  # the queue was blocked already: nothing changes
            return False
        self.advance(now)
        self._admit()
        return True

    def update(self, now: float, version: int, abort: bool) -> float:
        """Load new weights between two steps at or after ``now`` (pausing ``update_s``); in abort
        mode every running sample ends and is resubmitted with its partial output. Returns when the
        weights were loaded (what the controller's ``update_weights`` awaits)."""
        self.advance(now)
        if self.run and self.t < now:  # the step in progress ends first
            if self.run[0][0] == self.steps + 1:
                self._commit(self.steps + 1)
            else:
                self._decode(1)
        self.plan = None
        self.t = loaded = max(self.t, now) + self.update_cost
        self.tot.update_s += self.update_cost
        self.tot.running_s += len(self.run) * self.update_cost
        self.version = version
        self.updates += 1
        if not abort and not self.waiting and self.next_step > self.steps:
            # keep: the batch goes on as it was, every later step a pause later
            self.token += 1
            self.next_t += self.update_cost
            return loaded
        if abort and self.run:
            self._abort()
        self._admit()
        self.schedule()
        return loaded

    def _abort(self) -> None:
        """Every running sample returns with its partial output and is resubmitted at the back of
        the queue (re-prefill of prompt + partial output). With nothing waiting (and room in the KV
        cache) the samples take their slots back at once: the batch is kept and only the
        re-prefill (and the token it samples) is charged."""
        tot = self.tot
        if not self.waiting and (not self.kv_cap or self.ctx + len(self.run) <= self.kv_cap):
            self.plan = None
            n, ctx = len(self.run), self.ctx
            dt = ctx * self.p
            self.t += dt
            tot.prefill_s += dt
            tot.running_s += n * dt
            tot.prefill_tokens += ctx
            tot.generated += n
            self.ctx += n
            self.steps += 1  # each sample's next token came from the prefill, not a decode step
            self._commit(self.steps)
            return
        entries, self.run, self.ctx, self.groups = self.run, [], 0, []
        if self.layout is not None:
            self.layout.clear()
        tot.running -= len(entries)
        tot.waiting += len(entries)
        for end, _, grp, final, upd0, _ in entries:
            grp.pending += 1
            grp.last_end = -1
            length = final - grp.prompt_len
            self.waiting.append([grp, [length], length - (end - self.steps), False, upd0])
