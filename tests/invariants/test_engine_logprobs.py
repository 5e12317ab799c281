"""DESIGN §4.4 engine and trainer agree: for the same weights and tokens, the engine's behaviour
log-probs equal log softmax(logits / T) from a plain Hugging Face ``model(input_ids).logits`` forward
(fp32 CPU, max abs diff <= 1e-4), under continuous batching (mixed lengths, groups, top-p/top-k
truncation, which must NOT renormalise the log-probs) and for Llama, Qwen2 and Qwen3 decoders."""

from __future__ import annotations

import asyncio

import pytest
import torch

from asyncrl.models import build_tiny_policy, load_policy
from asyncrl.rollout.engine import LocalEngine
from asyncrl.rollout.sampling import SamplingParams

TOL = 1e-4


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_policy(tmp_path_factory.mktemp("tiny_logprobs"))


def trainer_logprobs(model, prompt, output, temperature):
    """What the trainer computes: one plain forward over prompt + output."""
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(output)])).logits[0].float()
    logits = logits[len(prompt) - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(output)[:, None])[:, 0]


def random_decoder(kind):
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    common = dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    match kind:
        case "qwen2":
            model = Qwen2ForCausalLM(Qwen2Config(**common))
            for layer in model.model.layers:  # make the q/k/v biases matter
                torch.nn.init.normal_(layer.self_attn.q_proj.bias, std=0.3)
                torch.nn.init.normal_(layer.self_attn.k_proj.bias, std=0.3)
        case "qwen3":
            model = Qwen3ForCausalLM(Qwen3Config(head_dim=24, **common))
            for layer in model.model.layers:
                torch.nn.init.normal_(layer.self_attn.q_norm.weight, 1.0, 0.3)
        case _:
            model = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, **common))
    return model.eval()


async def crowded_batch(eng, prompts, vocab):
    specs = [
        (SamplingParams(max_new_tokens=40, temperature=1.0, seed=1), 3),
        (SamplingParams(max_new_tokens=25, temperature=0.6, top_p=0.8, seed=2), 2),
        (SamplingParams(max_new_tokens=33, temperature=1.4, top_k=10, seed=3), 1),
        (SamplingParams(max_new_tokens=17, greedy=True), 1),
        (SamplingParams(max_new_tokens=50, temperature=0.9, top_p=0.95, top_k=30, seed=4), 2),
    ]
    jobs = [(p, sp, n) for p in prompts for sp, n in specs]
    outs = await asyncio.gather(*(eng.generate(p, sp, n) for p, sp, n in jobs))
    return [(p, sp, c) for (p, sp, _), cs in zip(jobs, outs, strict=True) for c in cs]


def check(eng, model, prompts):
    results = asyncio.run(asyncio.wait_for(crowded_batch(eng, prompts, eng.vocab_size), 120))
    worst = 0.0
    for prompt, sp, c in results:
        ref = trainer_logprobs(model, prompt, c.output_ids, sp.logprob_temperature)
        worst = max(worst, (ref - torch.tensor(c.behav_logprobs)).abs().max().item())
    assert worst <= TOL, f"engine vs trainer log-prob max abs diff {worst:.2e} > {TOL}"
    assert eng.stats()["decode_steps"] < sum(len(c.output_ids) for _, _, c in results) / 4  # really batched


def test_tiny_policy_engine_matches_trainer(tiny_dir):
    model, tok = load_policy(tiny_dir)
    ref, _ = load_policy(tiny_dir)
    eng = LocalEngine(model, tok, max_slots=12, max_seq_len=256)
    try:
        prompts = [tok(t)["input_ids"] for t in ("Q:1+2=?\nA:", "Q:123*45-6=?\nA:", "A:")]
        check(eng, ref, prompts)
    finally:
        eng.close()


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_hf_architectures_engine_matches_trainer(kind):
    model = random_decoder(kind)
    ref = random_decoder(kind)
    eng = LocalEngine(model, None, max_slots=12, max_seq_len=200)
    try:
        gen = torch.Generator().manual_seed(1)
        prompts = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (3, 11, 29)]
        check(eng, ref, prompts)
    finally:
        eng.close()


def test_log_probs_are_not_renormalised_by_truncation(tiny_dir):
    """With top_k=2 a renormalised log-prob would be >= log(1/2); the engine reports the full softmax."""
    model, tok = load_policy(tiny_dir)
    eng = LocalEngine(model, tok, max_slots=4, max_seq_len=128)
    try:
        p = tok("Q:5=?\nA:")["input_ids"]
        (c,) = asyncio.run(eng.generate(p, SamplingParams(max_new_tokens=30, top_k=2, seed=0)))
    finally:
        eng.close()
    ref = trainer_logprobs(model, p, c.output_ids, 1.0)
    assert (ref - torch.tensor(c.behav_logprobs)).abs().max().item() <= TOL
    assert min(c.behav_logprobs) < -1.0


@pytest.mark.gpu
def test_engine_matches_trainer_on_cuda(tiny_dir):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    model, tok = load_policy(tiny_dir)
    ref, _ = load_policy(tiny_dir)
    eng = LocalEngine(model, tok, max_slots=12, max_seq_len=256, device="cuda")
    try:
        prompts = [tok(t)["input_ids"] for t in ("Q:1+2=?\nA:", "Q:123*45-6=?\nA:")]
        check(eng, ref, prompts)
    finally:
        eng.close()
