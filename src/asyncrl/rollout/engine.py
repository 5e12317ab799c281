"""``LocalEngine``: continuous-batching generation over a local Hugging Face decoder, in its own thread.

Owns the scheduler: requests wait in a FIFO queue, join the running batch at the next step as
slots free up, and leave it the step they finish (their slot is reused at once). The G samples of
one request share its prefill (the prompt's KV is copied into their slots, or from a still-running
sibling when the group could only partly join). Each step decodes one token for every running
sample; each output token carries its behaviour log-prob (see ``sampling``) and the version of the weights
that sampled it. Full weight updates are applied between two steps, in one of two modes: ``abort`` (running
samples return their partial output with ``finish_reason="abort"``; see ``interruptible.generate_group`` for
the resubmission loop) or ``keep`` (the samples go on with their KV cache, computed partly under the old
weights). Adapter-only (LoRA) updates interrupt nothing: they add a version beside the others, and each
request keeps the one it was pinned to (``rollout.versions``).

Prefix reuse across turns (``prefix_reuse=True``, ``rollout.prefix_reuse``): a finished sample's slot keeps
its KV until a slot is needed; a prompt that extends that sequence (the next turn of a multi-turn
episode: the conversation so far, the environment's reply appended) is placed in it and only its new
tokens are prefilled (see ``scheduler``). No key is needed: the match is on the token ids, so it works
behind the engine server and the pool too (when the next turn reaches the same engine). A weight
update drops every retained sequence, and reuse never crosses versions: reused KV is the request's own.

One step is vLLM v1's ``EngineCore.step``::

    admission = scheduler.admit()            which waiting samples take which free slots (no sampling)
    start joins                              samples joining a running group: copy its prompt KV, first
                                             token from the prompt logits cached at its prefill
    plan = scheduler.schedule(prefills)      StepPlan: a decode row per slot + the prompts to prefill
    output = execute(plan)                   one forward (kv_forward), prompt KV fanned out, sampling
    scheduler.update(plan, output)           tokens appended, finished samples leave their slots

The scheduler (``scheduler``) owns slots and queue (tested without a model); the forward is ``kv_forward``.

Threading: the decode loop runs in one daemon thread; the asyncio side submits through a lock and
gets results back with ``loop.call_soon_threadsafe``. Every change of engine state (weight update,
abort, pause acknowledgement) is a control op run by the engine thread between two steps.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from asyncrl.choices import InterruptMode, check_choice
from asyncrl.rollout.api import check_prompt_ids
from asyncrl.rollout.engine_counters import EngineCounters
from asyncrl.rollout.kv_forward import SlotKVForward
from asyncrl.rollout.requests import Request, post, post_call
from asyncrl.rollout.sampling import SamplingParams, SlotParams, sample
from asyncrl.rollout.scheduler import Finished, Placement, Scheduler, StepOutput, StepPlan
from asyncrl.rollout.versions import VersionTable
from asyncrl.rollout.weights import copy_state, load_update_tensors
from asyncrl.types import Completion, WeightUpdate

__all__ = ["EngineDied", "LocalEngine", "SamplingParams", "load_update_tensors"]

log = logging.getLogger(__name__)


class EngineDied(RuntimeError):
    """The engine's decode thread is gone: the call cannot be served (the run counts it as an engine
    failure and stops after ``controller.max_engine_failures`` in a row)."""


class LocalEngine:
    """Continuous-batching engine over a local HF causal LM (see module docstring)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_slots: int,
        max_seq_len: int,
        interrupt_mode: InterruptMode = "abort",
        device: str = "cpu",
        version: int = 0,
        prefill_token_budget: int = 8192,
        prefix_reuse: bool = False,
        keep_versions: int = 1,
    ) -> None:
        """``max_slots`` and ``max_seq_len`` (the KV cache's size) have no default: a run sizes the engine from
        ``rollout.max_slots`` and ``rollout.max_prompt_len + rollout.max_new_tokens``. ``prefix_reuse``: keep a
        finished sample's KV for a prompt that extends it. ``keep_versions``: see ``rollout.versions``."""
        check_choice(interrupt_mode, InterruptMode, "interrupt_mode")
        if max_slots < 1 or max_seq_len < 2:
            raise ValueError("max_slots must be >= 1 and max_seq_len >= 2")
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.max_slots = max_slots
        self.max_seq_len = max_seq_len
        self.interrupt_mode = interrupt_mode
        self.device = torch.device(device)
        self.forward = SlotKVForward(self.model, max_slots=max_slots, max_seq_len=max_seq_len, device=self.device)
        self.vocab_size = self.forward.vocab_size
        self._state = self.model.state_dict()  # shares storage with the parameters
        self._version = int(version)
        self._rng = random.Random()
        # shared with the asyncio side (under _cv)
        self._cv = threading.Condition()
        self._incoming: list[Request] = []
        self._controls: list[tuple[Callable[[], Any], Any, asyncio.Future]] = []
        self._paused = False
        self._closed = False
        self._cancel_flag = False
        self._thread: threading.Thread | None = None
        self._dead: EngineDied | None = None
        """Set when the engine thread died: every call fails with it from then on."""
        # engine-thread state
        self.scheduler = Scheduler(
            max_slots=max_slots,
            max_seq_len=max_seq_len,
            prefill_token_budget=prefill_token_budget,
            scratch_slot=self.forward.scratch,
            prefix_reuse=prefix_reuse,
        )
        self._versions = VersionTable(self._version, keep_versions, self.scheduler, self.device)
        self._decode_params: tuple[int, SlotParams] | None = None  # (scheduler revision, decode rows' parameters)
        self.counters = EngineCounters()
        self._stats = self.counters.values  # the counters every part of the engine adds to

    # ------------------------------------------------------------------------------ public API
    @property
    def version(self) -> int:
        """Version of the weights in use (set by ``update_weights``): new requests run on it."""
        return self._version

    @property
    def versions(self) -> tuple[int, ...]:
        """The versions a request can run on now, oldest first (more than one after adapter updates)."""
        return self._versions.versions

    def start(self) -> None:
        """Start the decode thread (idempotent)."""
        with self._cv:
            if self._closed:
                raise RuntimeError("LocalEngine is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="asyncrl-engine", daemon=True)
                self._thread.start()

    reports_each_sample = True
    """``generate`` takes ``on_sample_done`` (see ``interruptible.generate_group``)."""

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling: SamplingParams,
        n: int = 1,
        on_sample_done: Callable[[int], None] | None = None,
        version: int | None = None,
    ) -> list[Completion]:
        """Generate ``n`` samples of one prompt (sharing its prefill); returns when all have finished
        (``stop``/``length``) or were aborted by a weight update (``abort``, partial output). ``on_sample_done(i)`` is
        called on this event loop as soon as sample ``i`` finishes with ``stop``/``length`` (not for aborted ones),
        before the whole group returns. ``version``: run on this held version (``versions``), not the current one
        (``VersionNotHeld`` if it is not held on arrival)."""
        prompt = check_prompt_ids(input_ids, max_seq_len=self.max_seq_len, vocab_size=self.vocab_size)
        if not isinstance(n, int) or not 1 <= n <= self.max_slots:
            raise ValueError(f"n must be an int in [1, max_slots={self.max_slots}], got {n!r}")
        self.start()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        base_seed = sampling.seed if sampling.seed is not None else self._rng.getrandbits(31)
        request = Request(prompt, sampling, n, int(base_seed), loop, future, on_sample_done, version)
        with self._cv:
            self._check_alive()
            self._incoming.append(request)
            self._cv.notify()
        try:
            return await future
        except asyncio.CancelledError:
            request.cancelled = True
            with self._cv:
                self._cancel_flag = True
                self._cv.notify()
            raise

    async def update_weights(self, update: WeightUpdate) -> None:
        """Load new weights between two decode steps; then ``version == update.version`` (``rollout.versions``)."""
        await self._control(lambda: self._apply_update(update))

    async def abort_all(self) -> int:
        """End every running sample now with ``finish_reason="abort"`` (SGLang's pause mode "abort").
        Returns how many samples were aborted."""
        return await self._control(self._abort_running)

    async def pause(self) -> None:
        """Stop admitting and decoding (running samples keep their slots and KV); returns once the
        engine thread is idle."""
        with self._cv:
            self._paused = True
        await self._control(lambda: None)

    async def resume(self) -> None:
        """Undo ``pause``."""
        with self._cv:
            self._paused = False
            self._cv.notify()

    @property
    def paused(self) -> bool:
        return self._paused

    def stats(self) -> dict[str, float]:
        """Cumulative counters. ``slot_utilisation`` = tokens sampled by decode steps /
        (max_slots x decode steps); ``generated_tokens`` also counts first tokens sampled at prefill.
        ``prefill_tokens`` are the prompt tokens computed; ``prefix_reused_tokens`` those taken from a
        retained sequence instead (``prefix_hits`` prompts); ``retained_slots`` hold a finished sample's KV
        now, ``retained_evicted`` were taken for other work, ``retained_dropped`` dropped by weight updates.
        ``running_sample_s``: the integral over time of the samples holding a slot (running), exact (the
        time average of running samples between two calls is its difference over the time between them)."""
        s = dict(self._stats)
        s["running_sample_s"] = self.counters.running_sample_s()
        s["retained_slots"] = float(len(self.scheduler.retained))
        s["retained_evicted"] = float(self.scheduler.retained_evicted)
        s["retained_dropped"] = float(self.scheduler.retained_dropped)
        steps = s["decode_steps"]
        s["slot_utilisation"] = s["decode_tokens"] / (self.max_slots * steps) if steps else 0.0
        s["running_samples"] = float(self.scheduler.num_running)
        s["waiting_requests"] = float(self.scheduler.num_waiting + len(self._incoming))
        s["version"] = float(self._version)
        s.update(self._versions.stats())
        s["max_slots"] = float(self.max_slots)
        return s

    def close(self) -> None:
        """Stop the decode thread; pending requests fail with ``RuntimeError``."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=30)
        self._fail_all(RuntimeError("LocalEngine closed"))

    # ------------------------------------------------------------------------------ submission helpers
    async def _control(self, fn: Callable[[], Any]) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.start()
        with self._cv:
            self._check_alive()
            self._controls.append((fn, loop, future))
            self._cv.notify()
        return await future

    # ------------------------------------------------------------------------------ engine thread
    def _has_work(self) -> bool:
        if self._controls or self._cancel_flag:
            return True
        scheduler = self.scheduler
        return not self._paused and bool(self._incoming or scheduler.num_waiting or scheduler.num_running)

    def _run(self) -> None:
        """The thread's body: serve until closed. If the thread itself dies (an error outside a step,
        e.g. in admission bookkeeping), every pending and later call fails with ``EngineDied``
        instead of waiting forever on a thread that is gone."""
        try:
            self._serve()
        except BaseException as exc:  # noqa: BLE001 - the thread is gone whatever it was; say so to every caller
            log.exception("LocalEngine thread died")
            died = EngineDied(f"the LocalEngine thread died: {exc!r}")
            died.__cause__ = exc
            with self._cv:
                self._dead = died
            self._fail_all(died)

    def _check_alive(self) -> None:
        """Raise ``EngineDied`` once the engine thread is gone (called under ``_cv``)."""
        if self._dead is not None:  # a fresh error per call: one shared instance would pile up tracebacks
            raise EngineDied(str(self._dead)) from self._dead.__cause__

    def _serve(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._cv:
                while not self._closed and not self._has_work():
                    self._cv.wait(timeout=1.0)
                if self._closed:
                    return
                controls, self._controls = self._controls, []
                self.scheduler.add(self._versions.pin(self._incoming))
                self._stats["requests"] += len(self._incoming)
                self._incoming = []
                cancel, self._cancel_flag = self._cancel_flag, False
                paused = self._paused
            try:
                for fn, loop, future in controls:
                    try:
                        value = fn()
                    except Exception as e:  # a bad update fails its caller, not the engine
                        log.warning("engine control op failed: %s", e)
                        post(loop, future, None, e)
                    else:
                        post(loop, future, value)
                if cancel:
                    self.scheduler.drop_cancelled()
                self._mark_occupancy()  # an abort or a cancel frees slots
                if paused:
                    continue
                t_start = time.perf_counter()
                self._step()
                self._stats["busy_s"] += time.perf_counter() - t_start
            except Exception as e:  # never let a step kill the thread: fail the in-flight requests
                log.exception("LocalEngine step failed; failing in-flight requests")
                self._fail_all(e)

    def _fail_all(self, exc: BaseException) -> None:
        requests = {id(r): r for r in self.scheduler.requests()}
        with self._cv:
            requests.update({id(r): r for r in self._incoming})
            self._incoming = []
            controls, self._controls = self._controls, []
        for request in requests.values():
            post(request.loop, request.future, None, exc)
        for _, loop, future in controls:
            post(loop, future, None, exc)
        self.scheduler.reset()
        self._decode_params = None
        self._mark_occupancy()

    def _mark_occupancy(self) -> float:
        """``EngineCounters.mark_occupancy`` at the scheduler's running count (called wherever the running
        samples may have changed); returns now."""
        return self.counters.mark_occupancy(self.scheduler.num_running)

    # ------------------------------------------------------------------------------ the step
    def _step(self) -> None:
        """One engine step, as vLLM v1's ``EngineCore.step``: schedule -> execute -> update.

        Samples joining a running group start before the plan is made (a KV copy, a first token from the
        group's cached prompt logits), so that they decode in this very step, like their siblings."""
        t_start = time.perf_counter()
        admission = self.scheduler.admit()
        self._mark_occupancy()
        if admission.joins:
            self._start_joins(admission.joins)
        plan = self.scheduler.schedule(admission.prefills)
        if plan is None:
            return
        t_scheduled = time.perf_counter()
        output = self._execute(plan)
        # counters first: a finished sample resolves a future whose caller may read stats()
        self.counters.count_step(plan)
        updated = self.scheduler.update(plan, output)
        # one instant settles occupancy and the step's time, before delivery (stats() may be read at once)
        self.counters.charge_time(plan, t_scheduled - t_start, self._mark_occupancy() - t_scheduled)
        if updated:  # versions too: a caller may read them at once
            self._versions.drop_unused()
        self._deliver(updated)

    def _start_joins(self, joins: tuple[Placement, ...]) -> None:
        """Samples joining a group whose prompt is cached: its KV copied from a running sibling, the first
        token sampled from the logits cached after the group's prefill."""
        for join in joins:
            assert join.kv_source is not None
            prompt_len = len(join.request.prompt)
            self.forward.copy_prefix(join.kv_source, list(join.slots), prompt_len)
            self._stats["kv_copied_tokens"] += prompt_len * len(join.slots)
        rows = [join.request.prompt_logits for join in joins for _ in join.slots]
        tokens, logprobs = self._sample_first_tokens(joins, rows)  # type: ignore[arg-type]
        self._stats["generated_tokens"] += len(tokens)
        self._deliver(self.scheduler.start(joins, tokens, logprobs, self._version))

    def _execute(self, plan: StepPlan) -> StepOutput:
        """Run the plan: one forward over the decode rows and the new prompts, each prompt's KV copied into
        its siblings' slots, a token sampled for every decode row and every newly prefilled sample."""
        decode_logits, prompt_logits = self.forward.step(plan.batch, self._versions.lora_rows(plan))
        decode_tokens: list[int] = []
        decode_logprobs: list[float] = []
        if plan.num_decode:
            assert decode_logits is not None
            positions = torch.tensor(plan.batch.decode_positions, dtype=torch.long, device=self.device)
            tokens, logprobs = sample(decode_logits, self._decode_sampling(plan), positions + 1)
            decode_tokens, decode_logprobs = tokens.tolist(), logprobs.tolist()
        first_tokens: list[int] = []
        first_logprobs: list[float] = []
        if plan.prefills:
            assert prompt_logits is not None
            for prefill in plan.prefills:
                self.forward.copy_prefix(prefill.slots[0], list(prefill.slots[1:]), len(prefill.request.prompt))
            rows = [prompt_logits[b] for b, prefill in enumerate(plan.prefills) for _ in prefill.slots]
            first_tokens, first_logprobs = self._sample_first_tokens(plan.prefills, rows)
        return StepOutput(self._version, decode_tokens, decode_logprobs, first_tokens, first_logprobs, prompt_logits)

    def _decode_sampling(self, plan: StepPlan) -> SlotParams:
        """The decode rows' sampling parameters, rebuilt only when the running samples changed."""
        revision = self.scheduler.revision
        if self._decode_params is None or self._decode_params[0] != revision:
            samples = plan.decode_samples
            params = SlotParams.build(
                [s.request.sampling if s else None for s in samples],
                [s.request.seeds[s.index] if s else 0 for s in samples],
                self.vocab_size,
                self.device,
            )
            self._decode_params = (revision, params)
        return self._decode_params[1]

    def _sample_first_tokens(
        self, placements: tuple[Placement, ...], rows: list[torch.Tensor]
    ) -> tuple[list[int], list[float]]:
        """The first token of each placed sample (placement by placement, slot by slot) from its prompt's
        last logits (``rows``, one per sample)."""
        params, seeds, positions = [], [], []
        for placement in placements:
            request = placement.request
            for index in placement.indices:
                params.append(request.sampling)
                seeds.append(request.seeds[index])
                positions.append(len(request.prompt))
        sampling = SlotParams.build(params, seeds, self.vocab_size, self.device)
        position_t = torch.tensor(positions, dtype=torch.long, device=self.device)
        tokens, logprobs = sample(torch.stack(rows), sampling, position_t)
        return tokens.tolist(), logprobs.tolist()

    def _deliver(self, finished: list[Finished]) -> None:
        """Record each ended sample's result; a request whose samples have all ended resolves its future."""
        for done in finished:
            sample_, request = done.sample, done.sample.request
            request.results[sample_.index] = sample_.completion(done.reason)
            request.remaining -= 1
            self._stats["finished_samples"] += 1
            if done.reason == "abort":
                self._stats["aborted_samples"] += 1
            elif request.on_sample_done is not None and not request.cancelled:
                post_call(request.loop, request.on_sample_done, sample_.index)
            if request.remaining == 0 and not request.cancelled:
                if any(c.finish_reason == "abort" for c in request.results if c is not None):
                    self._stats["aborted_requests"] += 1
                post(request.loop, request.future, list(request.results))

    # ------------------------------------------------------------------------------ control ops
    def _abort_running(self) -> int:
        aborted = self.scheduler.release_running()
        for sample_ in aborted:
            sample_.interruptions += 1
        self._mark_occupancy()  # before delivering: their caller may read stats() at once
        self._deliver([Finished(s, "abort") for s in aborted])
        return len(aborted)

    def _apply_update(self, update: WeightUpdate) -> None:
        t_start = time.perf_counter()
        if update.adapter is not None:  # a version beside the others: nothing running is touched
            self._versions.add_adapter(self.model, update, self.forward.dtype)
        else:
            copy_state(self._state, load_update_tensors(update), update.version)
            self.forward.refresh()
            self.scheduler.new_weights()
            self._versions.replace(int(update.version))  # what still waits or runs goes on with the new weights
        self._version = int(update.version)
        self._stats["weight_updates"] += 1
        if update.adapter is None and self.interrupt_mode == "abort":
            self._abort_running()
        elif update.adapter is None:
            for _, sample_ in self.scheduler.running():
                sample_.interruptions += 1
                self._stats["keep_interrupted_samples"] += 1
        self._stats["update_s"] += time.perf_counter() - t_start
