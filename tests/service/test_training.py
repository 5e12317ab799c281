"""The official ``tinker`` client trains and samples through ``asyncrl serve training``'s service.

A supervised loop (``cross_entropy`` lowers the loss), and a cookbook-style RL loop on the embedded
arithmetic task: sample -> score with the task's own reward -> ``forward_backward`` with advantages ->
``optim_step`` -> ``save_weights_and_get_sampling_client`` -> sample again, checking that the sampler's
version advances with every step and that the sampled log-probs are the trained weights' own.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from asyncrl.data.prompts import render_prompt
from asyncrl.data.synthetic import make_splits, teacher_solution
from asyncrl.reward.arithmetic import arithmetic_reward
from tests.service.conftest import BASE

tinker = pytest.importorskip("tinker")
types = tinker.types


def _sft_datum(tokenizer, question: str, answer_text: str):
    prompt = list(render_prompt(tokenizer, question))
    completion = tokenizer.encode(answer_text, add_special_tokens=False) + [tokenizer.eos_token_id]
    tokens = prompt + completion
    weights = [0.0] * (len(prompt) - 1) + [1.0] * len(completion)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
    )


def _rl_datum(prompt: list[int], seq, advantage: float):
    tokens = prompt + list(seq.tokens)
    n_prompt = len(prompt) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": [0.0] * n_prompt + list(seq.logprobs),
            "advantages": [0.0] * n_prompt + [advantage] * len(seq.tokens),
        },
    )


def test_a_supervised_step_lowers_the_loss(client) -> None:
    tc = client.create_lora_training_client(base_model=BASE, rank=8, seed=1).result()
    info = tc.get_info()
    assert info.is_lora and info.lora_rank == 8 and info.model_data.model_name == BASE
    tokenizer = tc.get_tokenizer()
    train, _ = make_splits(0, 4, 1)
    rng = random.Random(0)
    data = [_sft_datum(tokenizer, p.question, teacher_solution(p, rng, 0.0)) for p in train]
    losses = []
    for _ in range(4):
        fb = tc.forward_backward(data, "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=5e-3)).result()
        out = fb.result()
        assert len(out.loss_fn_outputs) == len(data)
        losses.append(out.metrics["loss:sum"])
    after = tc.forward(data, "cross_entropy").result().metrics["loss:sum"]
    assert after < losses[0] * 0.9, (losses, after)


def test_a_cookbook_rl_loop_advances_versions_and_returns_logprobs(service, client) -> None:
    tc = client.create_lora_training_client(base_model=BASE, rank=4, seed=2).result()
    tokenizer = tc.get_tokenizer()
    train, _ = make_splits(1, 2, 1)
    prompts = [list(render_prompt(tokenizer, p.question)) for p in train]
    params = types.SamplingParams(max_tokens=12, temperature=1.0, seed=3)
    # a warm-start step on the teacher's solutions, so that the weights move from the first step
    rng = random.Random(1)
    sft = [_sft_datum(tokenizer, p.question, teacher_solution(p, rng, 0.0)) for p in train]
    tc.forward_backward(sft, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    engines, versions, last = service.server.service.engines, [], None
    for _ in range(2):
        sampler = tc.save_weights_and_get_sampling_client().result()
        versions.append(engines.live_version(tc.model_id))  # the live engine took the update in flight
        batch = []
        for prompt, problem in zip(prompts, train, strict=True):
            result = sampler.sample(types.ModelInput.from_ints(prompt), 4, params).result()
            assert len(result.sequences) == 4
            for seq in result.sequences:
                assert len(seq.logprobs) == len(seq.tokens) > 0 and all(lp <= 0.0 for lp in seq.logprobs)
            rewards = [arithmetic_reward(tokenizer.decode(s.tokens), problem.answer) for s in result.sequences]
            mean = sum(rewards) / len(rewards)
            batch += [_rl_datum(prompt, s, r - mean) for s, r in zip(result.sequences, rewards, strict=True)]
            last = (prompt, result.sequences[0])
        tc.forward_backward(batch, "ppo").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    # the sampler of the trained weights: its log-probs are the trainer's for the same tokens (fp32, CPU)
    sampler = tc.save_weights_and_get_sampling_client().result()
    versions.append(engines.live_version(tc.model_id))
    assert versions == [1, 2, 3]  # one optimizer step each (the warm start's first)
    prompt, _ = last
    seq = sampler.sample(types.ModelInput.from_ints(prompt), 1, params).result().sequences[0]
    trained = tc.forward([_rl_datum(prompt, seq, 0.0)], "importance_sampling").result()
    all_lp = trained.loss_fn_outputs[0]["logprobs"].to_numpy()
    trainer_lp = all_lp[len(prompt) - 1 :]
    np.testing.assert_allclose(trainer_lp, np.asarray(seq.logprobs), atol=1e-4)
    # compute_logprobs (prompt log-probs) of the whole sequence: the trainer's too, the first one None
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(prompt + list(seq.tokens))).result()
    assert scored[0] is None and len(scored) == len(prompt) + len(seq.tokens)
    np.testing.assert_allclose(np.asarray(scored[1:], dtype=np.float64), all_lp, atol=1e-4)
    last = sampler.compute_logprobs(types.ModelInput.from_ints(prompt), prompt_logprobs_last_n=2).result()
    assert last[:-2] == [None] * (len(prompt) - 2)
    np.testing.assert_allclose(np.asarray(last[-2:]), all_lp[len(prompt) - 3 : len(prompt) - 1], atol=1e-4)


def test_a_named_sampler_checkpoint_keeps_its_version_while_training_goes_on(service, client) -> None:
    tc = client.create_lora_training_client(base_model=BASE, rank=4, seed=5).result()
    tokenizer = tc.get_tokenizer()
    train, _ = make_splits(2, 1, 1)
    sft = [_sft_datum(tokenizer, train[0].question, teacher_solution(train[0], random.Random(2), 0.0))]
    tc.forward_backward(sft, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    path = tc.save_weights_for_sampler("v1").result().path
    assert path == f"tinker://{tc.model_id}/sampler_weights/v1"
    prompt = list(render_prompt(tokenizer, train[0].question))
    seq = (
        client.create_sampling_client(model_path=path)
        .result()
        .sample(types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=8, seed=0))
        .result()
        .sequences[0]
    )
    at_v1 = tc.forward([_rl_datum(prompt, seq, 0.0)], "importance_sampling").result()
    tc.forward_backward(sft, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    tc.save_weights_and_get_sampling_client().result()  # the live engine moves on to version 2
    assert service.server.service.engines.live_version(tc.model_id) == 2
    assert service.server.service.engines.live_versions(tc.model_id) == (0, 1, 2)  # adapters: older ones held
    again = client.create_sampling_client(model_path=path).result()
    assert again.get_base_model() == BASE
    seq2 = again.sample(types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=8, seed=0))
    seq2 = seq2.result().sequences[0]
    assert list(seq2.tokens) == list(seq.tokens)  # same seed, same (version 1) weights, wherever they are served
    np.testing.assert_allclose(np.asarray(seq2.logprobs), np.asarray(seq.logprobs), atol=1e-5)
    lp_v1 = at_v1.loss_fn_outputs[0]["logprobs"].to_numpy()[len(prompt) - 1 :]
    np.testing.assert_allclose(lp_v1, np.asarray(seq.logprobs), atol=1e-4)


def test_a_custom_loss_runs_through_the_clients_own_surrogate(client) -> None:
    """``forward_backward_custom``: the client computes the loss from ``forward``'s log-probs and sends its
    gradient back as ``cross_entropy`` weights; the custom objective goes down."""
    tc = client.create_lora_training_client(base_model=BASE, rank=4, seed=7).result()
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([3, 4, 5, 6]),
        loss_fn_inputs={"target_tokens": [4, 5, 6, 7], "weights": [1.0] * 4},
    )

    def negative_log_likelihood(data, logprobs_list):
        loss = -sum(lp.sum() for lp in logprobs_list)
        return loss, {"nll:sum": float(loss.detach())}

    first = tc.forward_backward_custom([datum], negative_log_likelihood).result().metrics["nll:sum"]
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert tc.forward([datum], "cross_entropy").result().metrics["loss:sum"] < first
