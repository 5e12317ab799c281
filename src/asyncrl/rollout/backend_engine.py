"""``BackendEngine``: what the ``RolloutEngine``s over an outside decoding backend (``VLLMEngine``,
``SGLangEngine``) share, so that each backend's module holds only its own calls and shapes.

Both send every sample of a group as its own backend request, read the backend's per-token versions
back, and load weight updates from a safetensors directory with the backend paused. Owned here:

- the state of such an engine (``version``, the samples in flight, ``pause`` held, closed), its
  counters (``stats``) and its control lock (an update, ``pause``, ``resume`` and ``abort_all`` run
  one at a time);
- ``generate``: the checks (the prompt, ``n``, sampling the backend cannot report log-probs of), the
  backend made ready before the first request, one seed per sample (``seed + i``, as ``LocalEngine``
  numbers them; from a random base when unseeded), the budget, and each sample's end counted and
  reported to ``on_sample_done``;
- ``update_weights``: checked before anything changes, then pause in ``interrupt_mode``, load,
  resume unless ``pause`` holds the engine, timed and counted; ``pause``/``resume``/``abort_all``
  the same way over the backend's calls;
- the checks of an update against the starting checkpoint (``checkpoint_shapes``,
  ``check_update_shapes``), the backends' finish reasons (``FINISH_REASONS``) and a sample read back as a
  ``Completion`` (``backend_completion``).

A backend implements the hooks below the line ``backend hooks``: ``_ensure_ready``, ``_sample``,
``_update_source``, ``_pause_backend``, ``_resume_backend``, ``_load``, ``_abort_backend``,
``_release`` (and ``_prepare_update``, ``_check_n``, ``_check_sampling`` where it checks more).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from asyncrl.choices import InterruptMode, check_choice
from asyncrl.rollout.api import SampleDone, check_prompt_ids
from asyncrl.rollout.sampling import SEED_MOD, SamplingParams
from asyncrl.types import Completion, FinishReason, WeightUpdate

__all__ = ["FINISH_REASONS", "BackendEngine", "backend_completion", "check_update_shapes", "checkpoint_shapes"]

FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}
"""An engine's finish reason (vLLM's, SGLang's ``finish_reason.type``) -> the project's."""

COUNTERS = (
    "generated_tokens",
    "requests",
    "finished_samples",
    "aborted_samples",
    "weight_updates",
    "update_s",
    "keep_interrupted_samples",
)
"""The cumulative counters of ``BackendEngine.stats``."""


def checkpoint_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """``{HF name: shape}`` of the safetensors checkpoint in ``model_dir`` (headers only, no tensor read).

    Raises ``FileNotFoundError`` when it holds neither ``model.safetensors`` nor a sharded index."""
    from safetensors import safe_open

    single = model_dir / "model.safetensors"
    index = model_dir / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map") or {}
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
    else:
        raise FileNotFoundError(f"weight update: {model_dir} holds no model.safetensors (or sharded index)")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def check_update_shapes(path: Path, expected: dict[str, tuple[int, ...]], *, tied: bool, version: int) -> None:
    """Names and shapes of the safetensors update in ``path`` against ``expected`` (the starting checkpoint's,
    from ``checkpoint_shapes``), before an engine changes anything: ``KeyError`` for an unknown name,
    ``ValueError`` for a shape that differs. With ``tied`` embeddings an exported ``lm_head.weight`` is allowed."""
    shapes = checkpoint_shapes(path)
    want = dict(expected)
    if tied and "model.embed_tokens.weight" in want:  # a trainer may export the tied head too
        want.setdefault("lm_head.weight", want["model.embed_tokens.weight"])
    unknown = [k for k in shapes if k not in want]
    if unknown:
        raise KeyError(f"weight update v{version}: unknown parameter names {unknown[:5]}")
    for name, shape in shapes.items():
        if shape != want[name]:
            raise ValueError(f"weight update v{version}: {name} has shape {shape}, want {want[name]}")


def backend_completion(
    prompt: Sequence[int],
    ids: Sequence[int],
    logprobs: Sequence[float],
    versions: Sequence[int],
    reason: FinishReason,
    spans: int,
) -> Completion:
    """A sample read back from a backend as a ``Completion``: ``spans`` version spans over its output (each
    change of version inside it is an interruption, and so is an abort)."""
    return Completion(
        prompt_ids=tuple(int(t) for t in prompt),
        output_ids=tuple(ids),
        behav_logprobs=tuple(logprobs),
        versions=tuple(versions),
        finish_reason=reason,
        num_interruptions=max(0, spans - 1) + (1 if reason == "abort" else 0),
    )


class BackendEngine(ABC):
    """The shared part of a ``RolloutEngine`` over an outside backend (see the module docstring).

    A subclass sets ``vocab_size`` and ``max_seq_len`` in its constructor and implements the backend hooks."""

    BACKEND = "the backend"
    """The backend's name in messages (``vLLM``, ``SGLang``)."""

    vocab_size: int
    max_seq_len: int

    def __init__(self, *, interrupt_mode: InterruptMode, version: int) -> None:
        check_choice(interrupt_mode, InterruptMode, "interrupt_mode")
        self.interrupt_mode: InterruptMode = interrupt_mode
        self._version = int(version)
        self._lock: asyncio.Lock | None = None
        self._running = 0
        self._paused = False
        self._closed = False
        self._stats: dict[str, float] = dict.fromkeys(COUNTERS, 0.0)

    # ------------------------------------------------------------------------------ RolloutEngine
    @property
    def version(self) -> int:
        """Version of the weights the backend decodes with (the last update this engine made)."""
        return self._version

    @property
    def reports_each_sample(self) -> bool:
        """True: each sample is its own backend request, reported to ``on_sample_done`` as it ends."""
        return True

    def start(self) -> None:
        """A no-op (the backend runs already); a closed engine refuses."""
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling: SamplingParams,
        n: int = 1,
        on_sample_done: SampleDone | None = None,
    ) -> list[Completion]:
        """``n`` samples of one prompt, each finished (``stop``/``length``) or interrupted by an update in
        ``abort`` mode (``abort``, partial output); ``on_sample_done(i)`` as sample ``i`` ends with
        ``stop``/``length``."""
        self.start()
        prompt = check_prompt_ids(input_ids, max_seq_len=self.max_seq_len, vocab_size=self.vocab_size)
        self._check_n(n)
        self._check_sampling(sampling)
        await self._ensure_ready()
        base = sampling.seed if sampling.seed is not None else uuid.uuid4().int % SEED_MOD
        budget = min(sampling.max_new_tokens, self.max_seq_len - len(prompt))
        self._stats["requests"] += 1
        samples = [self._counted(prompt, sampling, budget, (base + i) % SEED_MOD, i, on_sample_done) for i in range(n)]
        return list(await asyncio.gather(*samples))

    async def update_weights(self, update: WeightUpdate) -> None:
        """Pause in ``interrupt_mode``, load the update's safetensors, resume (unless ``pause`` holds the
        engine); afterwards ``version == update.version``. A bad update (names, shapes) is refused before
        the pause: weights and version stay as they were."""
        self.start()
        await self._prepare_update(update)
        async with self._control_lock():
            t_start = time.perf_counter()
            running = self._running
            path = self._update_source(update)
            await self._pause_backend(self.interrupt_mode, clear_cache=self.interrupt_mode == "abort")
            try:
                await self._load(path, int(update.version))
            finally:
                if not self._paused:
                    await self._resume_backend()
            self._stats["weight_updates"] += 1
            if self.interrupt_mode == "keep":
                self._stats["keep_interrupted_samples"] += running
            self._stats["update_s"] += time.perf_counter() - t_start

    async def pause(self) -> None:
        """Freeze every running sample with its KV cache (the backend's pause mode ``keep``)."""
        self.start()
        async with self._control_lock():
            await self._pause_backend("keep", clear_cache=False)
            self._paused = True

    async def resume(self) -> None:
        """Undo ``pause``."""
        self.start()
        async with self._control_lock():
            self._paused = False
            await self._resume_backend()

    async def abort_all(self) -> int:
        """End every running sample now with ``finish_reason="abort"``; returns how many of this engine's
        samples were running."""
        self.start()
        async with self._control_lock():
            count = self._running
            await self._abort_backend()
            return count

    def stats(self) -> dict[str, float]:
        """Cumulative counters (``generated_tokens``, samples, updates) and the current state."""
        s = dict(self._stats)
        s["running_samples"] = float(self._running)
        s["version"] = float(self._version)
        return s

    def close(self) -> None:
        """Release the backend (``_release``) once; a closed engine refuses every call but ``close``."""
        if self._closed:
            return
        self._closed = True
        self._release()

    # ------------------------------------------------------------------------------ shared helpers
    def _control_lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    @contextmanager
    def _in_flight(self) -> Iterator[None]:
        """Counts a backend request as running (``abort_all``'s answer, ``keep_interrupted_samples``)."""
        self._running += 1
        try:
            yield
        finally:
            self._running -= 1

    async def _counted(
        self,
        prompt: list[int],
        sampling: SamplingParams,
        budget: int,
        seed: int,
        index: int,
        on_sample_done: SampleDone | None,
    ) -> Completion:
        """Sample ``index`` of a group (``_sample``), counted; ``on_sample_done(index)`` unless aborted."""
        completion = await self._sample(prompt, sampling, budget, seed)
        self._stats["generated_tokens"] += len(completion.output_ids)
        if completion.finish_reason == "abort":
            self._stats["aborted_samples"] += 1
        else:
            self._stats["finished_samples"] += 1
            if on_sample_done is not None:
                on_sample_done(index)
        return completion

    def _check_n(self, n: int) -> None:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")

    def _check_sampling(self, sampling: SamplingParams) -> None:
        """Refuse greedy decoding at a temperature other than 1: the backends report log-probs of argmax
        requests at temperature 1, not of the tempered distribution (``types.Completion``)."""
        if sampling.is_greedy and sampling.logprob_temperature != 1.0:
            raise ValueError(
                f"{type(self).__name__}: greedy decoding at temperature {sampling.temperature}: {self.BACKEND} "
                "reports log-probs of argmax requests at temperature 1, not of the tempered distribution (use "
                "temperature 1 or rollout.backend=local)"
            )

    # ------------------------------------------------------------------------------ backend hooks
    @abstractmethod
    async def _ensure_ready(self) -> None:
        """Before the first request: the backend decodes at this engine's version."""

    @abstractmethod
    async def _sample(self, prompt: list[int], sampling: SamplingParams, budget: int, seed: int) -> Completion:
        """One backend request (inside ``_in_flight``), to its end or to an abort. ``seed``: this sample's
        (``sampling.seed + i``, or from a random base when ``sampling.seed`` is None)."""

    async def _prepare_update(self, update: WeightUpdate) -> None:  # noqa: B027 (an optional hook: nothing by default)
        """Checks of ``update`` that may wait (outside the control lock), before anything changes."""

    @abstractmethod
    def _update_source(self, update: WeightUpdate) -> str | Path:
        """Under the control lock, before the pause: the update's safetensors directory (as the backend is
        to be given it), checked."""

    @abstractmethod
    async def _pause_backend(self, mode: InterruptMode, *, clear_cache: bool) -> None:
        """Pause the backend's scheduler: ``abort`` ends running requests, ``keep`` freezes them in place;
        ``clear_cache``: drop the prefix cache where the backend does it at the pause."""

    @abstractmethod
    async def _resume_backend(self) -> None:
        """Resume the backend's scheduler after a pause."""

    @abstractmethod
    async def _load(self, path: str | Path, version: int) -> None:
        """Load the weights in ``path`` labelled ``version`` (the backend is paused); ``version`` follows."""

    async def _abort_backend(self) -> None:  # noqa: B027 (an optional hook: nothing by default)
        """End every running request with ``finish_reason="abort"`` (``pause`` may hold the engine)."""

    def _release(self) -> None:  # noqa: B027 (an optional hook: nothing by default)
        """Release the backend and this engine's directories (called once, by ``close``)."""
