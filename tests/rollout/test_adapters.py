"""Adapter-only weight updates in ``LocalEngine`` (``rollout.adapters``, ``rollout.versions``): each held
version equals its merged weights, versions mix in one batch, a request keeps the version it was pinned
to, and unused versions are freed."""

from __future__ import annotations

import asyncio

import pytest
import torch

from asyncrl.rollout.adapters import VersionNotHeld, prepare_adapter
from asyncrl.rollout.engine import LocalEngine, SamplingParams
from asyncrl.types import WeightUpdate

TOL = 1e-4  # DESIGN §4 invariant 4 (fp32 on CPU)
PROMPT_TEXTS = ("Q:12+30=?\nA:", "Q:7*8=?\nA:", "Q:99-4=?\nA:")


def make_adapter(model, seed: int, rank: int = 4, skip: tuple[str, ...] = ()) -> dict:
    """Random LoRA factors on every linear layer of ``model`` (an untied ``lm_head`` too), large enough to
    change greedy outputs; names in ``skip`` stay unadapted."""
    gen = torch.Generator().manual_seed(seed)
    layers = {}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name in skip:
            continue
        if name == "lm_head" and module.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr():
            continue
        out, inp = module.weight.shape
        a = torch.randn(rank, inp, generator=gen) / inp**0.5
        b = torch.randn(out, rank, generator=gen) * 0.3
        layers[name] = (a, b, 1.5)
    return layers


def merged(load_tiny, adapter: dict, untie: bool = False):
    """A plain model with ``adapter`` folded into its weights (the reference)."""
    model, _ = load_tiny()
    if untie:
        untie_head(model)
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, (a, b, scaling) in adapter.items():
            modules[name].weight += scaling * b @ a
    return model.eval()


def untie_head(model) -> None:
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())


def reference(model, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens of ``model`` and their log-probs (a plain HF forward per token)."""
    ids = list(prompt)
    logps = []
    with torch.no_grad():
        for _ in range(n):
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), dim=-1)
            ids.append(int(logp.argmax()))
            logps.append(float(logp[ids[-1]]))
    return ids[len(prompt) :], torch.tensor(logps)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, greedy=True)


def check(completion, ref: tuple[list[int], torch.Tensor], version: int) -> None:
    tokens, logps = ref
    assert list(completion.output_ids) == tokens
    assert (torch.tensor(completion.behav_logprobs) - logps).abs().max().item() < TOL
    assert completion.versions == (version,) * len(tokens)
    assert completion.finish_reason == "length" and completion.num_interruptions == 0


@pytest.fixture
def make_engine(load_tiny):
    engines = []

    def make(untie: bool = False, **kwargs) -> LocalEngine:
        model, tok = load_tiny()
        if untie:
            untie_head(model)
        engine = LocalEngine(model, tok, max_slots=8, max_seq_len=256, **kwargs)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


def prompts(engine) -> list[list[int]]:
    return [engine.tokenizer(t)["input_ids"] for t in PROMPT_TEXTS]


def test_a_held_adapter_version_equals_its_merged_weights(make_engine, load_tiny, arun) -> None:
    engine = make_engine(untie=True)  # an untied lm_head takes an adapter too
    probe = load_tiny()[0]
    untie_head(probe)
    adapter = make_adapter(probe, seed=1, skip=("model.layers.1.self_attn.k_proj", "model.layers.2.mlp.up_proj"))
    assert "lm_head" in adapter
    p = prompts(engine)[0]
    base_ref = reference(merged(load_tiny, {}, untie=True), p, 30)
    ref = reference(merged(load_tiny, adapter, untie=True), p, 30)
    assert ref[0] != base_ref[0]  # the adapter changes the greedy output: the test can fail

    arun(engine.update_weights(WeightUpdate(1, adapter=adapter)))
    assert engine.version == 1 and engine.versions == (1,)
    (c,) = arun(engine.generate(p, greedy(30)))
    check(c, ref, 1)
    # sampled tokens: behaviour log-probs are the merged model's, to 1e-4
    outs = arun(engine.generate(p, SamplingParams(max_new_tokens=20, temperature=0.8, seed=3), n=3))
    model = merged(load_tiny, adapter, untie=True)
    for out in outs:
        ids = torch.tensor([list(p) + list(out.output_ids)])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, len(p) - 1 : -1] / 0.8, dim=-1)
        want = logp.gather(1, torch.tensor(out.output_ids)[:, None])[:, 0]
        assert (want - torch.tensor(out.behav_logprobs)).abs().max().item() < TOL
    assert engine.stats()["adapter_updates"] == 1


def test_requests_of_three_versions_share_one_batch_and_each_matches_its_own_weights(
    make_engine, load_tiny, arun
) -> None:
    engine = make_engine(keep_versions=3)
    probe = load_tiny()[0]
    a1, a2 = make_adapter(probe, seed=1), make_adapter(probe, seed=2)
    ps = prompts(engine)
    refs = [
        reference(merged(load_tiny, {}), ps[0], 24),  # version 0: the base weights
        reference(merged(load_tiny, a1), ps[1], 24),
        reference(merged(load_tiny, a2), ps[2], 24),
    ]

    async def go():
        await engine.update_weights(WeightUpdate(1, adapter=a1))
        await engine.update_weights(WeightUpdate(2, adapter=a2))
        assert engine.versions == (0, 1, 2)
        await engine.pause()  # the three arrive together: one prefill, then every decode step holds all three
        tasks = [asyncio.ensure_future(engine.generate(p, greedy(24), version=v)) for v, p in enumerate(ps)]
        for _ in range(3):
            await asyncio.sleep(0)
        await engine.resume()
        return [(await t)[0] for t in tasks]

    steps_before = engine.stats()["decode_steps"]
    outs = arun(go())
    for version, (out, ref) in enumerate(zip(outs, refs, strict=True)):
        check(out, ref, version)
    assert engine.stats()["decode_steps"] - steps_before == 23  # one shared step per token after the first


def test_a_request_in_flight_finishes_on_its_version_and_new_ones_take_the_new_one(
    make_engine, load_tiny, arun
) -> None:
    engine = make_engine(keep_versions=1)
    probe = load_tiny()[0]
    a1, a2 = make_adapter(probe, seed=1), make_adapter(probe, seed=2)
    p, q = prompts(engine)[:2]
    ref_old = reference(merged(load_tiny, a1), p, 120)
    ref_new = reference(merged(load_tiny, a2), q, 20)

    async def go():
        await engine.update_weights(WeightUpdate(1, adapter=a1))
        first = asyncio.ensure_future(engine.generate(p, greedy(120)))
        while engine.stats()["generated_tokens"] < 5:
            await asyncio.sleep(0.001)
        await engine.pause()  # the first request holds its slot (and version 1) meanwhile
        await engine.update_weights(WeightUpdate(2, adapter=a2))
        held_during = engine.versions
        second = asyncio.ensure_future(engine.generate(q, greedy(20)))
        await asyncio.sleep(0)
        await engine.resume()
        return (await first)[0], (await second)[0], held_during

    old, new, held_during = arun(go())
    assert held_during == (1, 2)  # version 1 stays while a request uses it, beyond keep_versions=1
    check(old, ref_old, 1)  # not aborted, not interrupted, every token of version 1
    check(new, ref_new, 2)
    assert engine.versions == (2,)  # freed when its last request ended
    # dropped: version 0 at the first update (unused), version 1 when its request ended
    assert engine.stats()["versions_dropped"] == 2 and engine.stats()["aborted_samples"] == 0


def test_a_full_update_drops_every_adapter_version(make_engine, load_tiny, arun) -> None:
    engine = make_engine(keep_versions=4)  # abort mode
    probe = load_tiny()[0]
    a1 = make_adapter(probe, seed=1)
    p = prompts(engine)[0]
    full = merged(load_tiny, make_adapter(probe, seed=5)).state_dict()

    async def go():
        await engine.update_weights(WeightUpdate(1, adapter=a1))
        running = asyncio.ensure_future(engine.generate(p, greedy(200)))
        while engine.stats()["generated_tokens"] < 3:
            await asyncio.sleep(0.001)
        await engine.update_weights(WeightUpdate(7, tensors=full))
        return (await running)[0]

    aborted = arun(go())
    assert aborted.finish_reason == "abort" and set(aborted.versions) == {1}
    assert engine.versions == (7,)
    (after,) = arun(engine.generate(p, greedy(15)))
    model = load_tiny()[0]
    model.load_state_dict(full)
    check(after, reference(model.eval(), p, 15), 7)
    with pytest.raises(VersionNotHeld):
        arun(engine.generate(p, greedy(5), version=1))


def test_prefix_reuse_never_crosses_versions(make_engine, load_tiny, arun) -> None:
    engine = make_engine(keep_versions=2, prefix_reuse=True)
    probe = load_tiny()[0]
    a1, a2 = make_adapter(probe, seed=1), make_adapter(probe, seed=2)
    p = prompts(engine)[0]
    arun(engine.update_weights(WeightUpdate(1, adapter=a1)))
    (turn,) = arun(engine.generate(p, greedy(8)))
    nxt = list(p) + list(turn.output_ids) + engine.tokenizer("\nQ:", add_special_tokens=False)["input_ids"]
    arun(engine.update_weights(WeightUpdate(2, adapter=a2)))
    (on_new,) = arun(engine.generate(nxt, greedy(10)))  # version 2: version 1's KV is not reused
    assert engine.stats()["prefix_hits"] == 0
    check(on_new, reference(merged(load_tiny, a2), nxt, 10), 2)
    (on_old,) = arun(engine.generate(nxt, greedy(10), version=1))  # version 1: reused
    assert engine.stats()["prefix_hits"] == 1
    check(on_old, reference(merged(load_tiny, a1), nxt, 10), 1)


def test_unknown_versions_and_bad_adapters_are_refused(make_engine, load_tiny, arun) -> None:
    engine = make_engine()
    p = prompts(engine)[0]
    with pytest.raises(VersionNotHeld, match="version 3"):
        arun(engine.generate(p, greedy(4), version=3))
    probe = load_tiny()[0]
    good = make_adapter(probe, seed=1)
    with pytest.raises(KeyError, match="embed_tokens"):  # an embedding (and the tied lm_head) is no linear layer
        arun(
            engine.update_weights(
                WeightUpdate(1, adapter={**good, "model.embed_tokens": good["model.layers.0.self_attn.q_proj"]})
            )
        )
    a, b, s = good["model.layers.0.mlp.down_proj"]
    with pytest.raises(ValueError, match="down_proj"):
        arun(engine.update_weights(WeightUpdate(1, adapter={**good, "model.layers.0.mlp.down_proj": (b.T, a.T, s)})))
    assert engine.versions == (0,)  # nothing changed; the engine still serves
    (c,) = arun(engine.generate(p, greedy(5)))
    assert c.versions == (0,) * 5
    prepared = prepare_adapter(probe, good, dtype=torch.float32, device=torch.device("cpu"))
    assert prepared.nbytes == sum(a.numel() * 4 + b.numel() * 4 for a, b, _ in good.values())
