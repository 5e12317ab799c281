"""DESIGN §4.2 exact versions: every token's version is the version of the weights that produced it.

Checked by recomputing each token's behaviour log-prob from the per-token versions alone, with a
plain Hugging Face model whose weights are swapped exactly where the stamps say:
- ``keep``: the KV of position j is computed by the step that sampled token j+1 (prompt: by the
  prefill that sampled the first token), so an HF forward with a KV cache, switching weights
  between single-token calls as the stamps dictate, reproduces the engine's log-probs;
- ``abort``: each resubmitted chunk is a fresh prefill, so token t's log-prob is a full forward of
  prompt + output[:t] under the weights of version ``versions[t]``.
The versions differ enough (noise on every weight) that a wrong stamp breaks the match.
"""

from __future__ import annotations

import asyncio
import inspect

import pytest
import torch
from transformers import DynamicCache

from asyncrl.models import build_tiny_policy, load_policy
from asyncrl.rollout.engine import LocalEngine
from asyncrl.rollout.interruptible import generate_group
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import WeightUpdate

TOL = 1e-4


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_policy(tmp_path_factory.mktemp("tiny_versions"))


def versioned_states(model, n_versions):
    base = {k: v.clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    states = [base]
    for _ in range(1, n_versions):
        states.append({k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in base.items()})
    return states


async def run_with_updates(eng, states, prompt, sampling, n):
    task = asyncio.create_task(generate_group(eng, prompt, sampling, n))
    for v in range(1, len(states)):
        start = eng.stats()["decode_steps"]
        while eng.stats()["decode_steps"] < start + 7:
            await asyncio.sleep(0.001)
        await eng.update_weights(WeightUpdate(version=v, tensors={k: t.clone() for k, t in states[v].items()}))
    return await task


def keep_reference(ref, states, prompt, out, versions, temperature):
    """Log-probs under 'KV of position j computed by the weights stamped on token j+1'."""
    cache = DynamicCache()
    # transformers >= 5.x calls the argument `cache`; older versions `past_key_values`.
    cache_kw = "cache" if "cache" in inspect.signature(ref.forward).parameters else "past_key_values"
    lps = []
    with torch.no_grad():
        for t, tok in enumerate(out):
            ref.load_state_dict(states[versions[t]])
            inp = list(prompt) if t == 0 else [out[t - 1]]
            logits = ref(torch.tensor([inp]), use_cache=True, **{cache_kw: cache}).logits[0, -1]
            lps.append(torch.log_softmax(logits / temperature, -1)[tok].item())
    return torch.tensor(lps)


def abort_reference(ref, states, prompt, out, versions, temperature):
    full = torch.tensor([list(prompt) + list(out)])
    lps = torch.empty(len(out))
    with torch.no_grad():
        for v in sorted(set(versions)):
            ref.load_state_dict(states[v])
            logits = ref(full).logits[0, len(prompt) - 1 : -1] / temperature
            lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(out)[:, None])[:, 0]
            for t, vt in enumerate(versions):
                if vt == v:
                    lps[t] = lp[t]
    return lps


@pytest.mark.parametrize("mode", ["keep", "abort"])
def test_per_token_versions_are_exact(tiny_dir, mode):
    model, tok = load_policy(tiny_dir)
    ref, _ = load_policy(tiny_dir)
    states = versioned_states(model, 3)
    eng = LocalEngine(model, tok, max_slots=8, max_seq_len=256, interrupt_mode=mode)
    prompt = tok("Q:7+5=?\nA:")["input_ids"]
    sampling = SamplingParams(max_new_tokens=60, temperature=0.8, seed=11)
    try:
        outs = asyncio.run(asyncio.wait_for(run_with_updates(eng, states, prompt, sampling, 3), 60))
    finally:
        eng.close()
    reference = keep_reference if mode == "keep" else abort_reference
    for c in outs:
        assert set(c.versions) == {0, 1, 2}, "the updates must land mid-generation for this test to mean anything"
        assert list(c.versions) == sorted(c.versions)
        expected = reference(ref, states, prompt, c.output_ids, c.versions, 0.8)
        got = torch.tensor(c.behav_logprobs)
        assert (expected - got).abs().max().item() <= TOL
        # A stamp that is off by one token at a version boundary would not match:
        shifted = list(c.versions)
        b = shifted.index(1)
        shifted[b] = 0
        wrong = reference(ref, states, prompt, c.output_ids, shifted, 0.8)
        assert (wrong - got).abs().max().item() > 100 * TOL
