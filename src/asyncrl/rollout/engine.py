"""``LocalEngine``: continuous-batching generation over a local Hugging Face decoder, in its own thread.

Owns the scheduler: requests wait in a FIFO queue, join the running batch at the next step as
slots free up, and leave it the step they finish (their slot is reused at once). The G samples of
one request share its prefill (the prompt's KV is copied into their slots, or from a still-running
sibling when the group could only partly join). Each step decodes one token for every running
sample; each output token carries its behaviour log-prob (see ``sampling``) and the weights'
version at the step that sampled it. Weight updates are applied between two steps, in one of two
modes: ``abort`` (running samples return their partial output with ``finish_reason="abort"``; see
``interruptible.generate_group`` for the resubmission loop) or ``keep`` (the samples go on with their
KV cache, computed partly under the old weights). The model forward lives in ``kv_forward``.

Threading: the decode loop runs in one daemon thread; the asyncio side submits through a lock and
gets results back with ``loop.call_soon_threadsafe``. Every change of engine state (weight update,
abort, pause acknowledgement) is a control op run by the engine thread between two steps.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch

from asyncrl.choices import InterruptMode, check_choice
from asyncrl.rollout.kv_forward import SlotKVForward
from asyncrl.rollout.requests import Request as _Request
from asyncrl.rollout.requests import Sample as _Sample
from asyncrl.rollout.requests import post as _post
from asyncrl.rollout.requests import post_call as _post_call
from asyncrl.rollout.sampling import SamplingParams, SlotParams, sample
from asyncrl.rollout.weights import copy_state, load_update_tensors
from asyncrl.types import Completion, WeightUpdate

__all__ = ["LocalEngine", "SamplingParams", "load_update_tensors"]

log = logging.getLogger(__name__)


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
    ) -> None:
        """``max_slots`` and ``max_seq_len`` (the KV cache's size) have no default: a run sizes the engine from
        ``rollout.max_slots`` and ``rollout.max_prompt_len + rollout.max_new_tokens``."""
        check_choice(interrupt_mode, InterruptMode, "interrupt_mode")
        if max_slots < 1 or max_seq_len < 2:
            raise ValueError("max_slots must be >= 1 and max_seq_len >= 2")
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.max_slots = max_slots
        self.max_seq_len = max_seq_len
        self.interrupt_mode = interrupt_mode
        self.device = torch.device(device)
        self.prefill_token_budget = prefill_token_budget
        self.fwd = SlotKVForward(self.model, max_slots=max_slots, max_seq_len=max_seq_len, device=self.device)
        self.vocab_size = self.fwd.vocab_size
        self._state = self.model.state_dict()  # shares storage with the parameters
        self._version = int(version)
        self._epoch = 0  # bumps at every weight update (invalidates shared prompt logits)
        self._rng = random.Random()
        # shared with the asyncio side (under _cv)
        self._cv = threading.Condition()
        self._incoming: list[_Request] = []
        self._controls: list[tuple[Callable[[], Any], Any, asyncio.Future]] = []
        self._paused = False
        self._closed = False
        self._cancel_flag = False
        self._thread: threading.Thread | None = None
        # engine-thread state
        self._waiting: deque[_Request] = deque()
        self._slots: list[_Sample | None] = [None] * max_slots
        self._free = list(range(max_slots))  # a heap: lowest slot first keeps the batch prefix dense
        self._hi = 0  # slots [0, hi) hold every running sample
        self._n_active = 0
        self._sp: SlotParams | None = None
        self._stats: dict[str, float] = dict.fromkeys(
            (
                "generated_tokens", "decode_tokens", "decode_steps", "busy_s", "decode_s", "prefill_s",
                "prefill_tokens", "prefill_padded_tokens", "prefill_batches", "kv_copied_tokens",
                "aborted_requests", "aborted_samples", "finished_samples", "requests", "weight_updates",
                "update_s", "keep_interrupted_samples",
            ),
            0.0,
        )  # fmt: skip

    # ------------------------------------------------------------------------------ public API
    @property
    def version(self) -> int:
        """Version of the weights in use (set by ``update_weights``)."""
        return self._version

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
    ) -> list[Completion]:
        """Generate ``n`` samples of one prompt (sharing its prefill); returns when all have finished
        (``stop``/``length``) or were aborted by a weight update (``abort``, partial output).
        ``on_sample_done(i)`` is called on this event loop as soon as sample ``i`` finishes with
        ``stop``/``length`` (not for aborted ones), before the whole group returns."""
        prompt = self._check_prompt(input_ids)
        if not isinstance(n, int) or not 1 <= n <= self.max_slots:
            raise ValueError(f"n must be an int in [1, max_slots={self.max_slots}], got {n!r}")
        self.start()
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        base = sampling.seed if sampling.seed is not None else self._rng.getrandbits(31)
        req = _Request(prompt, sampling, n, int(base), loop, fut, on_sample_done)
        with self._cv:
            self._incoming.append(req)
            self._cv.notify()
        try:
            return await fut
        except asyncio.CancelledError:
            req.cancelled = True
            with self._cv:
                self._cancel_flag = True
                self._cv.notify()
            raise

    async def update_weights(self, update: WeightUpdate) -> None:
        """Load new weights between two decode steps; afterwards ``version == update.version``."""
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
        (max_slots x decode steps); ``generated_tokens`` also counts first tokens sampled at prefill."""
        s = dict(self._stats)
        steps = s["decode_steps"]
        s["slot_utilisation"] = s["decode_tokens"] / (self.max_slots * steps) if steps else 0.0
        s["running_samples"] = float(self._n_active)
        s["waiting_requests"] = float(len(self._waiting) + len(self._incoming))
        s["version"] = float(self._version)
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
    def _check_prompt(self, input_ids: Sequence[int]) -> list[int]:
        try:
            prompt = [int(t) for t in input_ids]
        except (TypeError, ValueError) as e:
            raise ValueError(f"input_ids must be a sequence of ints: {e}") from None
        if not prompt:
            raise ValueError("input_ids is empty")
        if len(prompt) >= self.max_seq_len:
            raise ValueError(f"prompt has {len(prompt)} tokens; max_seq_len={self.max_seq_len} leaves no room")
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise ValueError(f"input_ids must lie in [0, vocab_size={self.vocab_size})")
        return prompt

    async def _control(self, fn: Callable[[], Any]) -> Any:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.start()
        with self._cv:
            self._controls.append((fn, loop, fut))
            self._cv.notify()
        return await fut

    # ------------------------------------------------------------------------------ engine thread
    def _has_work(self) -> bool:
        if self._controls or self._cancel_flag:
            return True
        return not self._paused and bool(self._incoming or self._waiting or self._n_active)

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._cv:
                while not self._closed and not self._has_work():
                    self._cv.wait(timeout=1.0)
                if self._closed:
                    return
                controls, self._controls = self._controls, []
                self._waiting.extend(self._incoming)
                self._stats["requests"] += len(self._incoming)
                self._incoming = []
                cancel, self._cancel_flag = self._cancel_flag, False
                paused = self._paused
            try:
                for fn, loop, fut in controls:
                    try:
                        value = fn()
                    except Exception as e:  # a bad update fails its caller, not the engine
                        log.warning("engine control op failed: %s", e)
                        _post(loop, fut, None, e)
                    else:
                        _post(loop, fut, value)
                if cancel:
                    self._drop_cancelled()
                if paused:
                    continue
                t0 = time.perf_counter()
                self._step()
                self._stats["busy_s"] += time.perf_counter() - t0
            except Exception as e:  # never let a step kill the thread: fail the in-flight requests
                log.exception("LocalEngine step failed; failing in-flight requests")
                self._fail_all(e)

    def _fail_all(self, exc: BaseException) -> None:
        reqs = {id(s.req): s.req for s in self._slots if s is not None}
        reqs.update({id(r): r for r in self._waiting})
        with self._cv:
            reqs.update({id(r): r for r in self._incoming})
            self._incoming = []
            controls, self._controls = self._controls, []
        for r in reqs.values():
            _post(r.loop, r.fut, None, exc)
        for _, loop, fut in controls:
            _post(loop, fut, None, exc)
        self._waiting.clear()
        self._slots = [None] * self.max_slots
        self._free = list(range(self.max_slots))
        self._hi = self._n_active = 0
        self._sp = None

    def _drop_cancelled(self) -> None:
        for i, s in enumerate(self._slots):
            if s is not None and s.req.cancelled:
                self._release(i)
        self._waiting = deque(r for r in self._waiting if not r.cancelled)

    def _release(self, slot: int) -> _Sample:
        s = self._slots[slot]
        assert s is not None
        self._slots[slot] = None
        heapq.heappush(self._free, slot)
        s.req.live.discard(slot)
        self._n_active -= 1
        while self._hi and self._slots[self._hi - 1] is None:
            self._hi -= 1
        self._sp = None
        return s

    def _finish(self, slot: int, reason: str) -> None:
        s = self._release(slot)
        req = s.req
        req.results[s.idx] = Completion(
            prompt_ids=tuple(req.prompt),
            output_ids=tuple(s.out),
            behav_logprobs=tuple(s.lps),
            versions=tuple(s.vers),
            finish_reason=reason,  # type: ignore[arg-type]
            num_interruptions=s.interrupts,
        )
        req.remaining -= 1
        self._stats["finished_samples"] += 1
        if reason == "abort":
            self._stats["aborted_samples"] += 1
        elif req.on_sample_done is not None and not req.cancelled:
            _post_call(req.loop, req.on_sample_done, s.idx)
        if req.remaining == 0 and not req.cancelled:
            if any(c.finish_reason == "abort" for c in req.results if c is not None):
                self._stats["aborted_requests"] += 1
            _post(req.loop, req.fut, list(req.results))

    def _push_token(self, slot: int, s: _Sample, tok: int, lp: float, version: int) -> None:
        s.out.append(tok)
        s.lps.append(lp)
        s.vers.append(version)
        s.last = tok
        s.pos += 1
        if tok in s.req.stop:
            self._finish(slot, "stop")
        elif len(s.out) >= s.limit:
            self._finish(slot, "length")

    # ------------------------------------------------------------------------------ admission + step
    def _admit(self) -> list[tuple[_Request, list[int]]]:
        """Place waiting samples into free slots (FIFO). Returns the requests whose prompt must be
        prefilled in this step (first new slot = where the prompt's KV is computed). Samples of a group
        that could only partly join earlier copy the prompt KV from a running sibling instead."""
        admits: list[tuple[_Request, list[int], list[int], bool]] = []
        budget = self.prefill_token_budget
        while self._waiting and self._free:
            req = self._waiting[0]
            if req.cancelled:
                self._waiting.popleft()
                continue
            needs_prefill = req.first_epoch != self._epoch or not req.live
            if needs_prefill and admits and budget < len(req.prompt):
                break  # enough prefill work for this step; the rest joins at the next one
            k = min(len(self._free), len(req.pending))
            slots = [heapq.heappop(self._free) for _ in range(k)]
            idxs = [req.pending.popleft() for _ in range(k)]
            if not req.pending:
                self._waiting.popleft()
            admits.append((req, slots, idxs, needs_prefill))
            if needs_prefill:
                budget -= len(req.prompt)
        if not admits:
            return []
        copied: list[tuple[_Request, list[int]]] = []
        for req, slots, idxs, needs_prefill in admits:
            if not needs_prefill:
                self.fwd.copy_prefix(min(req.live), slots, len(req.prompt))
                self._stats["kv_copied_tokens"] += len(req.prompt) * len(slots)
                copied.append((req, slots))
            limit = min(req.sampling.max_new_tokens, self.max_seq_len - len(req.prompt))
            for slot, idx in zip(slots, idxs, strict=True):
                self._slots[slot] = _Sample(req, idx, limit)
                req.live.add(slot)
                self._n_active += 1
                self._hi = max(self._hi, slot + 1)
        self._sp = None
        if copied:  # their first tokens come from the logits cached at the group's first prefill
            self._first_tokens(copied)
        return [(req, slots) for req, slots, _, needs_prefill in admits if needs_prefill]

    def _first_tokens(self, items: list[tuple[_Request, list[int]]]) -> None:
        """Sample the first token of each new sample from its prompt's last logits."""
        rows, params, seeds, positions = [], [], [], []
        for req, slots in items:
            for slot in slots:
                s = self._slots[slot]
                assert s is not None
                rows.append(req.first_logits)
                params.append(req.sampling)
                seeds.append(req.seeds[s.idx])
                positions.append(len(req.prompt))
            if not req.pending:  # every sample admitted: the shared logits are no longer needed
                req.first_logits, req.first_epoch = None, -1
        sp = SlotParams.build(params, seeds, self.vocab_size, self.device)
        pos_t = torch.tensor(positions, dtype=torch.long, device=self.device)
        tok, lp = sample(torch.stack(rows), sp, pos_t)
        tok_l, lp_l = tok.tolist(), lp.tolist()
        self._stats["generated_tokens"] += len(tok_l)
        self._sp = None
        version, j = self._version, 0
        for _req, slots in items:
            for slot in slots:
                s = self._slots[slot]
                assert s is not None
                self._push_token(slot, s, tok_l[j], lp_l[j], version)
                j += 1

    def _step(self) -> None:
        """Admit, then one forward: a decode token for every started sample plus the prefill of the
        newly admitted prompts (one set of matmuls for both)."""
        t0 = time.perf_counter()
        prefills = self._admit()
        t_adm = time.perf_counter()
        hi = self._hi
        dec = [s if s is not None and s.last >= 0 else None for s in self._slots[:hi]]
        n_dec = sum(1 for s in dec if s is not None)
        if not n_dec and not prefills:
            return
        if n_dec and self._sp is None:
            self._sp = SlotParams.build(
                [s.req.sampling if s else None for s in dec],
                [s.req.seeds[s.idx] if s else 0 for s in dec],
                self.vocab_size,
                self.device,
            )
        poss = [s.pos if s else 0 for s in dec] if n_dec else []
        dec_logits, pre_logits = self.fwd.step(
            [s.last if s else 0 for s in dec] if n_dec else [],
            poss,
            [i if s else self.fwd.scratch for i, s in enumerate(dec)] if n_dec else [],
            [slots[0] for _, slots in prefills],
            [req.prompt for req, _ in prefills],
        )
        version = self._version
        if n_dec:
            assert dec_logits is not None and self._sp is not None
            pos_t = torch.tensor(poss, dtype=torch.long, device=self.device)
            tok, lp = sample(dec_logits, self._sp, pos_t + 1)
            tok_l, lp_l = tok.tolist(), lp.tolist()
            # Counters first: pushing a token may resolve a future whose caller reads stats() at once.
            self._stats["decode_steps"] += 1
            self._stats["decode_tokens"] += n_dec
            self._stats["generated_tokens"] += n_dec
            for i, s in enumerate(dec):
                if s is not None:
                    self._push_token(i, s, tok_l[i], lp_l[i], version)
        if prefills:
            assert pre_logits is not None
            plens = [len(req.prompt) for req, _ in prefills]
            self._stats["prefill_tokens"] += sum(plens)
            self._stats["prefill_padded_tokens"] += len(plens) * max(plens)
            self._stats["prefill_batches"] += 1
            for b, (req, slots) in enumerate(prefills):
                self.fwd.copy_prefix(slots[0], slots[1:], plens[b])
                self._stats["kv_copied_tokens"] += plens[b] * (len(slots) - 1)
                req.first_logits = pre_logits[b]
                req.first_epoch = self._epoch
            self._first_tokens(prefills)
        t1 = time.perf_counter()
        # Time split: a step with prompts is charged to prefill in proportion to its rows.
        share = sum(len(r.prompt) for r, _ in prefills) / max(1, sum(len(r.prompt) for r, _ in prefills) + n_dec)
        self._stats["prefill_s"] += (t_adm - t0) + share * (t1 - t_adm)
        self._stats["decode_s"] += (1 - share) * (t1 - t_adm)

    # ------------------------------------------------------------------------------ control ops
    def _abort_running(self) -> int:
        n = 0
        for i, s in enumerate(self._slots):
            if s is not None:
                s.interrupts += 1
                self._finish(i, "abort")
                n += 1
        return n

    def _apply_update(self, update: WeightUpdate) -> None:
        t0 = time.perf_counter()
        copy_state(self._state, load_update_tensors(update), update.version)
        self.fwd.refresh()
        self._version = int(update.version)
        self._epoch += 1
        self._stats["weight_updates"] += 1
        if self.interrupt_mode == "abort":
            self._abort_running()
        else:
            for s in self._slots:
                if s is not None:
                    s.interrupts += 1
                    self._stats["keep_interrupted_samples"] += 1
        self._stats["update_s"] += time.perf_counter() - t0
