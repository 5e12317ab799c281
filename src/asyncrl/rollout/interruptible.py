"""The interruptible generation loop (AReaL's): resubmit aborted samples until they finish.

``generate_group(engine, prompt_ids, sampling, n)`` asks the engine for n samples of one prompt. A
sample that comes back with ``finish_reason="abort"`` (a weight update in ``abort`` mode) is
resubmitted as prompt + partial output with the remaining token budget, so its KV cache is
recomputed under the new weights; the chunks are merged (output ids, behaviour log-probs, per-token
versions as stamped by the engine, interruption counts). Sample i keeps its own seed
(``sampling.seed + i``) across resubmissions, so with unchanged weights the merged output equals an
uninterrupted generation token for token (greedy or seeded). Works with any
``rollout.api.RolloutEngine`` (``LocalEngine``, ``RemoteEngine``, ``EnginePool``, the Ray clients).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

from asyncrl.rollout.api import RolloutEngine, SampleDone
from asyncrl.rollout.sampling import SEED_MOD, SamplingParams
from asyncrl.types import Completion

__all__ = ["generate_group", "resume_sample"]


async def resume_sample(
    engine: RolloutEngine, prompt_ids: Sequence[int], sampling: SamplingParams, first: Completion, sample_idx: int = 0
) -> Completion:
    """Continue one sample until it is no longer aborted; ``first`` is its first chunk."""
    prompt = tuple(int(t) for t in prompt_ids)
    out, lps, vers = list(first.output_ids), list(first.behav_logprobs), list(first.versions)
    interruptions = first.num_interruptions
    reason = first.finish_reason
    seed = None if sampling.seed is None else (sampling.seed + sample_idx) % SEED_MOD
    while reason == "abort":
        remaining = sampling.max_new_tokens - len(out)
        if remaining <= 0:
            reason = "length"
            break
        chunk_params = replace(sampling, max_new_tokens=remaining, seed=seed)
        (chunk,) = await engine.generate(prompt + tuple(out), chunk_params, 1)
        out.extend(chunk.output_ids)
        lps.extend(chunk.behav_logprobs)
        vers.extend(chunk.versions)
        interruptions += chunk.num_interruptions
        reason = chunk.finish_reason
    return Completion(
        prompt_ids=prompt,
        output_ids=tuple(out),
        behav_logprobs=tuple(lps),
        versions=tuple(vers),
        finish_reason=reason,
        num_interruptions=interruptions,
    )


async def generate_group(
    engine: RolloutEngine,
    prompt_ids: Sequence[int],
    sampling: SamplingParams,
    n: int,
    on_sample_done: SampleDone | None = None,
) -> list[Completion]:
    """n samples of one prompt, each run to ``stop``/``length`` across any number of aborts.

    ``on_sample_done(i)`` is called once per sample, as soon as sample ``i`` is known to be final:
    the moment the engine finishes it when the engine reports samples one by one
    (``engine.reports_each_sample``, ``LocalEngine``), otherwise when the engine's call returns
    (other engines answer a group at once) or when an aborted sample's resubmissions end."""
    prompt = tuple(int(t) for t in prompt_ids)
    if sampling.seed is None:
        # Fix a seed per group so that a resubmitted sample keeps drawing its own random stream.
        import random

        sampling = replace(sampling, seed=random.getrandbits(31))
    if on_sample_done is not None and engine.reports_each_sample:
        first = await engine.generate(prompt, sampling, n, on_sample_done=on_sample_done)
    else:
        first = await engine.generate(prompt, sampling, n)
        if on_sample_done is not None:
            for i, c in enumerate(first):
                if c.finish_reason != "abort":
                    on_sample_done(i)

    async def finish(i: int, c: Completion) -> Completion:
        if c.finish_reason != "abort":
            return c
        done = await resume_sample(engine, prompt, sampling, c, i)
        if on_sample_done is not None:
            on_sample_done(i)
        return done

    return list(await asyncio.gather(*(finish(i, c) for i, c in enumerate(first))))
