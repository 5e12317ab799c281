"""The scheduler of ``LocalEngine``: which sample runs in which KV slot, and what each step computes.

vLLM v1's split: the scheduler decides, the executor runs, the scheduler takes the output back.

- ``admit()`` places waiting samples into free slots (FIFO; the lowest free slot first keeps the
  running samples in a dense prefix ``[0, end)``). It samples nothing and touches no cache.
- ``schedule(prefills)`` turns the running samples and the admitted prompts into a ``StepPlan``,
  the only record the executor reads.
- ``update(plan, output)`` appends the sampled tokens and ends the samples that stopped;
  ``start(placements, ...)`` appends first tokens. Both return the samples that ended, whose slots
  are free again.

A group's G samples share one prefill: the prompt is computed into the first slot of its placement
and its KV copied into the others after the forward. Samples of a group that could only partly join
(too few free slots) join later by copying a running sibling's prompt KV and take their first token
from the logits cached after the group's prefill (``Request.prompt_logits``); after a weight update
those logits are stale (``new_weights``) and the prompt is prefilled again. Prompts to prefill in
one step are capped by ``prefill_token_budget`` (the first always goes).

Prefix reuse (``prefix_reuse=True``): a sample that ends (``stop``/``length``) leaves its slot *retained*:
free, but remembered with the ids whose KV it holds (prompt + output but the last token, which was never
fed). A new prompt that extends a retained sequence (the next turn of an episode: the conversation so
far + the environment's reply) takes that slot and prefills only the tokens after it
(``Placement.reused``). Retained slots are the least wanted free slots: a sample without a match takes
an empty slot first and evicts the least recently retained one only when none is left, so admission
never waits on retained KV; the bound is the free slots themselves (at most ``max_slots - running``).
A weight update drops every retained slot (their KV is of the old weights); while the engine holds
several adapter versions, a retained sequence is only reused by a request pinned to the same weights
(``Request.weights``). Aborted and cancelled samples retain nothing.

Versions: a sample's tokens are stamped with its request's pinned weights' version (``Request.weights``),
or with the step's ``StepOutput.version`` for a request the engine did not pin.

It holds no tensor of its own and runs no model: ``tests/rollout/test_scheduler.py`` drives it with a
fake forward.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from asyncrl.rollout.kv_forward import ForwardBatch
from asyncrl.rollout.requests import Request, Sample
from asyncrl.types import FinishReason

__all__ = ["Admission", "Finished", "Placement", "Scheduler", "StepOutput", "StepPlan"]


@dataclass(frozen=True)
class Placement:
    """Samples of one request placed into free slots by ``Scheduler.admit``."""

    request: Request
    slots: tuple[int, ...]
    """The slots, in the order of ``indices``."""
    indices: tuple[int, ...]
    """The samples' indices within the request (their seeds and result positions)."""
    kv_source: int | None
    """A join: the slot of a running sibling whose prompt KV the slots copy, their first token taken from
    the cached prompt logits. None: the prompt is prefilled this step into ``slots[0]``."""
    reused: int = 0
    """Positions ``[0, reused)`` of ``slots[0]`` already hold the prompt's KV (a retained sequence it
    extends): only ``prompt[reused:]`` is prefilled."""

    @property
    def prefill_ids(self) -> list[int]:
        """The prompt tokens this placement computes."""
        return self.request.prompt[self.reused :] if self.reused else self.request.prompt


@dataclass(frozen=True)
class Admission:
    """What ``Scheduler.admit`` placed, in admission order."""

    joins: tuple[Placement, ...]
    """Samples joining a running group (no prefill)."""
    prefills: tuple[Placement, ...]
    """Requests whose prompt is prefilled in this step."""


@dataclass(frozen=True)
class StepPlan:
    """One engine step as the scheduler decided it: decode every started sample, prefill the new prompts."""

    decode_samples: tuple[Sample | None, ...]
    """Row i decodes the sample in slot i, for the slots ``[0, rows)``; None: an idle row (an empty slot, or
    a sample whose first token comes from this step's prefill). Empty when no sample decodes."""
    num_decode: int
    """Decode rows that are not idle."""
    prefills: tuple[Placement, ...]
    """Prompt b of ``batch`` is ``prefills[b]``'s; its KV is copied from ``slots[0]`` into the other slots."""
    batch: ForwardBatch
    """The forward's input (decode rows, then prompts)."""

    @property
    def num_prefill_tokens(self) -> int:
        """Prompt tokens computed by this step (reused prefixes excluded)."""
        return sum(len(p.request.prompt) - p.reused for p in self.prefills)


@dataclass(frozen=True)
class StepOutput:
    """What the executor computed for a ``StepPlan``."""

    version: int
    """The engine's current version at the step (the stamp of the tokens of unpinned requests)."""
    decode_tokens: list[int]
    """One per decode row (idle rows' values are ignored)."""
    decode_logprobs: list[float]
    first_tokens: list[int]
    """The first token of each newly prefilled sample, placement by placement, slot by slot."""
    first_logprobs: list[float]
    prompt_logits: torch.Tensor | None
    """[prefills, V]: the logits after each prompt (cached for its samples still waiting for a slot)."""


@dataclass(frozen=True)
class Finished:
    """A sample that ended (its slot is free again)."""

    sample: Sample
    reason: FinishReason


class Scheduler:
    """Slots, the waiting queue and the step plan of ``LocalEngine`` (see the module docstring)."""

    def __init__(
        self,
        *,
        max_slots: int,
        max_seq_len: int,
        prefill_token_budget: int,
        scratch_slot: int,
        prefix_reuse: bool = False,
    ) -> None:
        self.max_slots = max_slots
        self.prefix_reuse = prefix_reuse
        self.max_seq_len = max_seq_len
        self.prefill_token_budget = prefill_token_budget
        self.scratch_slot = scratch_slot
        """Where idle decode rows write their K/V (``SlotKVForward.scratch``)."""
        self.waiting: deque[Request] = deque()
        self.slots: list[Sample | None] = [None] * max_slots
        self.num_running = 0
        self.revision = 0
        """Bumps whenever the set of decoding samples may change (cache key of per-row sampling parameters)."""
        self.weights_epoch = 0
        """Bumps at every weight update (``Request.prompt_logits`` of an older epoch are stale)."""
        self._free = list(range(max_slots))  # a heap: lowest slot first keeps the batch prefix dense
        self._end = 0  # slots [0, end) hold every running sample
        self.retained: OrderedDict[int, list[int]] = OrderedDict()
        """Free slots that still hold an ended sample's KV: slot -> the ids at positions ``[0, len)``, least
        recently retained first (not in the ``_free`` heap)."""
        self.retained_evicted = 0
        """Retained slots taken by samples that did not extend them (slot pressure)."""
        self.retained_dropped = 0
        """Retained slots dropped by weight updates and resets."""
        self._retained_weights: dict[int, object] = {}
        """Retained slot -> the weights (``Request.weights``) its KV was computed with."""

    # ------------------------------------------------------------------ queue and slots
    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def add(self, requests: Iterable[Request]) -> None:
        """Queue requests (FIFO)."""
        self.waiting.extend(requests)

    def running(self) -> list[tuple[int, Sample]]:
        """(slot, sample) of every running sample, by slot."""
        return [(slot, s) for slot, s in enumerate(self.slots) if s is not None]

    def requests(self) -> list[Request]:
        """Every request waiting or running, once each."""
        found = {id(s.request): s.request for s in self.slots if s is not None}
        found.update({id(r): r for r in self.waiting})
        return list(found.values())

    @property
    def num_free(self) -> int:
        """Slots a sample can take now (empty or retained)."""
        return len(self._free) + len(self.retained)

    def release(self, slot: int, retain: bool = False) -> Sample:
        """Free a slot; returns the sample that ran in it. ``retain`` (with ``prefix_reuse``): keep the
        slot's KV for a prompt that extends the sample's sequence."""
        sample = self.slots[slot]
        assert sample is not None
        self.slots[slot] = None
        if retain and self.prefix_reuse:
            prompt = sample.request.prompt  # the last output token's KV was never computed
            self.retained[slot] = prompt + sample.output_ids[: sample.position - len(prompt)]
            self._retained_weights[slot] = sample.request.weights
        else:
            heapq.heappush(self._free, slot)
        sample.request.live_slots.discard(slot)
        self.num_running -= 1
        while self._end and self.slots[self._end - 1] is None:
            self._end -= 1
        self.revision += 1
        return sample

    def release_running(self) -> list[Sample]:
        """Free every slot; returns the samples, by slot."""
        return [self.release(slot) for slot, _ in self.running()]

    def drop_cancelled(self) -> None:
        """Forget the samples and waiting requests of cancelled requests."""
        for slot, s in self.running():
            if s.request.cancelled:
                self.release(slot)
        self.waiting = deque(r for r in self.waiting if not r.cancelled)

    def reset(self) -> None:
        """Forget every request (the engine failed them)."""
        self.waiting.clear()
        self.slots = [None] * self.max_slots
        self._free = list(range(self.max_slots))
        self.retained_dropped += len(self.retained)
        self.retained.clear()
        self._retained_weights.clear()
        self._end = self.num_running = 0
        self.revision += 1

    def new_weights(self) -> None:
        """A weight update: cached prompt logits and retained KV are stale from now on."""
        self.weights_epoch += 1
        self.drop_retained()

    def drop_retained(self) -> None:
        """Free every retained slot (its KV is forgotten)."""
        self.retained_dropped += len(self.retained)
        for slot in self.retained:
            heapq.heappush(self._free, slot)
        self.retained.clear()
        self._retained_weights.clear()

    def _take_slot(self) -> int:
        """An empty slot (lowest first), else the least recently retained one (evicted)."""
        if self._free:
            return heapq.heappop(self._free)
        slot, _ = self.retained.popitem(last=False)
        self._retained_weights.pop(slot, None)
        self.retained_evicted += 1
        return slot

    def _match(self, request: Request) -> tuple[int, int] | None:
        """(slot, length) of the longest retained sequence of the request's weights that its prompt extends
        by at least one token."""
        best: tuple[int, int] | None = None
        prompt = request.prompt
        for slot, ids in self.retained.items():
            if self._retained_weights.get(slot) is not request.weights:
                continue
            n = len(ids)
            if n < len(prompt) and (best is None or n > best[1]) and prompt[n - 1] == ids[-1] and prompt[:n] == ids:
                best = (slot, n)
        return best

    # ------------------------------------------------------------------ the step
    def admit(self) -> Admission:
        """Place waiting samples into free slots, FIFO, while prefill work stays within the budget."""
        joins: list[Placement] = []
        prefills: list[Placement] = []
        budget = self.prefill_token_budget
        while self.waiting and self.num_free:
            request = self.waiting[0]
            if request.cancelled:
                self.waiting.popleft()
                continue
            needs_prefill = request.prompt_logits_epoch != self.weights_epoch or not request.live_slots
            match = self._match(request) if needs_prefill and self.retained else None
            reused = match[1] if match is not None else 0
            if needs_prefill and (joins or prefills) and budget < len(request.prompt) - reused:
                break  # enough prefill work for this step; the rest joins at the next one
            count = min(self.num_free, len(request.pending))
            first = () if match is None else (match[0],)
            if match is not None:
                del self.retained[match[0]]
                self._retained_weights.pop(match[0], None)
            slots = first + tuple(self._take_slot() for _ in range(count - len(first)))
            indices = tuple(request.pending.popleft() for _ in range(count))
            if not request.pending:
                self.waiting.popleft()
            kv_source = None if needs_prefill else min(request.live_slots)
            placement = Placement(request, slots, indices, kv_source, reused)
            self._place(placement)
            if needs_prefill:
                prefills.append(placement)
                budget -= len(request.prompt) - reused
            else:
                joins.append(placement)
        return Admission(tuple(joins), tuple(prefills))

    def _place(self, placement: Placement) -> None:
        request = placement.request
        limit = min(request.sampling.max_new_tokens, self.max_seq_len - len(request.prompt))
        for slot, index in zip(placement.slots, placement.indices, strict=True):
            self.slots[slot] = Sample(request, index, limit)
            request.live_slots.add(slot)
            self.num_running += 1
            self._end = max(self._end, slot + 1)
        self.revision += 1

    def schedule(self, prefills: tuple[Placement, ...]) -> StepPlan | None:
        """The plan of this step: a decode row for every slot in ``[0, end)`` (idle where no started sample
        runs) and the prompts of ``prefills``; None when there is nothing to compute."""
        samples: list[Sample | None] = []
        tokens: list[int] = []
        positions: list[int] = []
        write_slots: list[int] = []
        num_decode = 0
        for slot, s in enumerate(self.slots[: self._end]):
            if s is not None and s.started:
                samples.append(s)
                tokens.append(s.last_token)
                positions.append(s.position)
                write_slots.append(slot)
                num_decode += 1
            else:
                samples.append(None)
                tokens.append(0)
                positions.append(0)
                write_slots.append(self.scratch_slot)
        if not num_decode:
            if not prefills:
                return None
            samples, tokens, positions, write_slots = [], [], [], []
        batch = ForwardBatch(
            tokens,
            positions,
            write_slots,
            [p.slots[0] for p in prefills],
            [p.prefill_ids for p in prefills],
            [p.reused for p in prefills] if any(p.reused for p in prefills) else [],
        )
        return StepPlan(tuple(samples), num_decode, prefills, batch)

    def update(self, plan: StepPlan, output: StepOutput) -> list[Finished]:
        """Append the step's tokens (decode rows first, then the first tokens of the prefilled samples);
        returns the samples that ended, in that order."""
        finished: list[Finished] = []
        for slot, s in enumerate(plan.decode_samples):
            if s is not None:
                version = output.version if s.request.weights is None else s.request.weights.version
                reason = s.append(output.decode_tokens[slot], output.decode_logprobs[slot], version)
                if reason is not None:
                    finished.append(Finished(self.release(slot, retain=True), reason))
        if plan.prefills:
            assert output.prompt_logits is not None
            for b, placement in enumerate(plan.prefills):
                placement.request.prompt_logits = output.prompt_logits[b]
                placement.request.prompt_logits_epoch = self.weights_epoch
            finished += self.start(plan.prefills, output.first_tokens, output.first_logprobs, output.version)
        return finished

    def start(
        self, placements: tuple[Placement, ...], tokens: list[int], logprobs: list[float], version: int
    ) -> list[Finished]:
        """Append the first token of each placed sample (placement by placement, slot by slot); a request
        with every sample placed drops its cached prompt logits. Returns the samples that ended."""
        finished: list[Finished] = []
        row = 0
        for placement in placements:
            if not placement.request.pending:  # every sample admitted: the shared logits are no longer needed
                placement.request.prompt_logits, placement.request.prompt_logits_epoch = None, -1
            weights = placement.request.weights
            stamp = version if weights is None else weights.version
            for slot in placement.slots:
                s = self.slots[slot]
                assert s is not None
                reason = s.append(tokens[row], logprobs[row], stamp)
                if reason is not None:
                    finished.append(Finished(self.release(slot, retain=True), reason))
                row += 1
        self.revision += 1
        return finished
