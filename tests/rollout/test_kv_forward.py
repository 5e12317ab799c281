"""SlotKVForward: prefill/decode logits equal a plain HF forward (incl. the split attention path)."""

from __future__ import annotations

import pytest
import torch

from asyncrl.rollout.kv_forward import ForwardBatch, SlotKVForward, UnsupportedModelError


def hf_last_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]


def test_prefill_and_decode_with_split_attention_match_hf(load_tiny):
    model, _ = load_tiny()
    f = SlotKVForward(model, max_slots=16, max_seq_len=256, device="cpu")
    gen = torch.Generator().manual_seed(0)
    lens = [3, 5, 8, 4, 6, 7, 5, 9, 4, 3, 6, 5, 140, 8, 4, 120]  # two long sequences among short ones
    seqs = [torch.randint(4, 90, (n,), generator=gen).tolist() for n in lens]
    logits = f.prefill(list(range(16)), seqs)
    for b in (0, 12, 15):
        assert (logits[b] - hf_last_logits(model, seqs[b])).abs().max().item() < 1e-4
    split_seen = False
    for _ in range(4):
        nxt = torch.randint(4, 90, (16,), generator=gen).tolist()
        pos = [len(s) for s in seqs]
        short, long_rows = f.plan_split(pos)
        split_seen |= bool(long_rows)
        out, _ = f.step(ForwardBatch(nxt, pos, list(range(16))))
        for b in range(16):
            seqs[b].append(nxt[b])
        for b in (0, 7, 12, 15):
            assert (out[b] - hf_last_logits(model, seqs[b])).abs().max().item() < 1e-4
    assert split_seen and set(long_rows) == {12, 15} and short < 120


def test_idle_slots_inside_the_batch_are_harmless(load_tiny):
    model, _ = load_tiny()
    f = SlotKVForward(model, max_slots=4, max_seq_len=64, device="cpu")
    seqs = [[5, 6, 7, 8], [9, 10]]
    f.prefill([0, 2], seqs)
    # slot 1 is idle (token 0 at position 0, K/V to the scratch slot); slot 3 is beyond hi
    out, _ = f.step(ForwardBatch([11, 0, 12], [4, 0, 2], [0, f.scratch, 2]))
    assert (out[0] - hf_last_logits(model, seqs[0] + [11])).abs().max().item() < 1e-4
    assert (out[2] - hf_last_logits(model, seqs[1] + [12])).abs().max().item() < 1e-4


def test_refresh_picks_up_in_place_weight_changes(load_tiny):
    model, _ = load_tiny()
    f = SlotKVForward(model, max_slots=2, max_seq_len=64, device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    f.refresh()
    ids = [5, 6, 7, 8, 9]
    assert (f.prefill([0], [ids])[0] - hf_last_logits(model, ids)).abs().max().item() < 1e-4


def test_unsupported_architecture_is_a_clear_error():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(UnsupportedModelError, match="model_type='gpt2'"):
        SlotKVForward(model, max_slots=2, max_seq_len=32, device="cpu")


def test_mixed_step_prefills_new_prompts_while_decoding_others(load_tiny):
    model, _ = load_tiny()
    f = SlotKVForward(model, max_slots=8, max_seq_len=128, device="cpu")
    gen = torch.Generator().manual_seed(0)
    rand = lambda n: torch.randint(4, 90, (n,), generator=gen).tolist()  # noqa: E731
    seqs: dict[int, list[int]] = {}
    first = [rand(5), rand(9), rand(3)]
    dec, pre = f.step(ForwardBatch(prefill_slots=[0, 2, 5], prefill_prompts=first))
    assert dec is None
    for b, slot in enumerate([0, 2, 5]):
        seqs[slot] = first[b]
        assert (pre[b] - hf_last_logits(model, first[b])).abs().max().item() < 1e-4
    for new_slots, new_lens in (([1, 7], [7, 2]), ([], [])):
        hi = max(seqs) + 1
        nxt = {s: rand(1)[0] for s in seqs}
        toks = [nxt.get(i, 0) for i in range(hi)]
        pos = [len(seqs[i]) if i in seqs else 0 for i in range(hi)]
        write = [i if i in seqs else f.scratch for i in range(hi)]  # idle rows write to the scratch slot
        prompts = [rand(n) for n in new_lens]
        dec, pre = f.step(ForwardBatch(toks, pos, write, new_slots, prompts))
        for s in list(seqs):
            seqs[s] = seqs[s] + [nxt[s]]
            assert (dec[s] - hf_last_logits(model, seqs[s])).abs().max().item() < 1e-4
        for b, slot in enumerate(new_slots):
            seqs[slot] = prompts[b]
            assert (pre[b] - hf_last_logits(model, prompts[b])).abs().max().item() < 1e-4
    assert sorted(seqs) == [0, 1, 2, 5, 7]


@pytest.mark.parametrize("one_by_one", [False, True])
def test_several_new_prompts_batched_or_one_by_one(load_tiny, one_by_one):
    model, _ = load_tiny()
    f = SlotKVForward(model, max_slots=4, max_seq_len=64, device="cpu")
    if one_by_one:
        f.max_batched_scores = 0  # force the per-prompt path (used for long prompts)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [15]]
    logits = f.prefill([3, 0, 1], prompts)
    for b, p in enumerate(prompts):
        assert (logits[b] - hf_last_logits(model, p)).abs().max().item() < 1e-4
    out, _ = f.step(ForwardBatch([20, 21, 22, 0], [7, 1, 0, 3], [0, 1, f.scratch, 3]))
    assert (out[0] - hf_last_logits(model, prompts[1] + [20])).abs().max().item() < 1e-4
    assert (out[3] - hf_last_logits(model, prompts[0] + [0])).abs().max().item() < 1e-4
