"""Packing and micro-batching: balanced bins, and packing is invisible to the model (DESIGN §4.5)."""

from __future__ import annotations

import random

import pytest
import torch

from asyncrl.models import load_policy
from asyncrl.trainer.packing import pack, split_micro_batches, token_logprobs


def test_split_respects_budget_and_keeps_every_index() -> None:
    rng = random.Random(0)
    lengths = [rng.choice([5, 10, 20, 80, 300]) for _ in range(200)]
    bins = split_micro_batches(lengths, 512)
    flat = sorted(i for b in bins for i in b)
    assert flat == list(range(200))
    for b in bins:
        assert sum(lengths[i] for i in b) <= 512
    loads = [sum(lengths[i] for i in b) for b in bins]
    assert max(loads) - min(loads) <= 300  # balanced to within one long sequence


def test_split_oversized_sequence_gets_its_own_bin_and_multiples() -> None:
    bins = split_micro_batches([1000, 10, 10], 100)
    assert [0] in bins and sorted(i for b in bins for i in b) == [0, 1, 2]
    bins = split_micro_batches([10] * 9, 1000, multiple_of=4)
    assert len(bins) == 4
    assert split_micro_batches([], 10) == []
    with pytest.raises(ValueError):
        split_micro_batches([1], 0)


def test_pack_positions_and_mask() -> None:
    mb = pack([[1, 2, 3], [4, 5]], [7, 9])
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    allowed = (mb.attention_mask[0, 0] == 0).int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 0, 0, 1, 0],
        [0, 0, 0, 1, 1],
    ]
    assert mb.sample_indices == [7, 9]


def test_packed_logprobs_and_grads_equal_padded(tiny_policy_dir) -> None:
    torch.manual_seed(0)
    model, _ = load_policy(tiny_policy_dir)
    seqs = [torch.randint(4, 90, (n,)).tolist() for n in (9, 3, 14, 6)]
    mb = pack(seqs, list(range(4)))
    logits = model(input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=mb.attention_mask).logits[0]
    packed = mb.gather_token_values(token_logprobs(logits, mb.input_ids[0], temperature=0.7))
    (packed.sum()).backward()
    grads_packed = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    total = 0.0
    for row, seq in enumerate(seqs):
        ids = torch.tensor(seq)[None]
        lp = torch.log_softmax(model(input_ids=ids).logits[0].float() / 0.7, -1)
        ref = lp[:-1].gather(-1, ids[0, 1:, None]).squeeze(-1)
        assert torch.allclose(packed[row, 1 : len(seq)], ref, atol=1e-5)
        assert torch.all(packed[row, len(seq) :] == 0) and packed[row, 0] == 0
        total = total + ref.sum()
    total.backward()
    for gp, p in zip(grads_packed, model.parameters(), strict=True):
        assert torch.allclose(gp, p.grad, rtol=1e-4, atol=1e-6)
