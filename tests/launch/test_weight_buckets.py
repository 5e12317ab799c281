"""Object-store weight buckets: exact round trip, bucket limits, metadata checks."""

from __future__ import annotations

import pytest
import torch

from asyncrl.launch.weight_buckets import pack_buckets, unpack_bucket


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(7, 5, generator=g),
        "b.bias": torch.randn(3, generator=g).to(torch.bfloat16),
        "c.big": torch.randn(64, 64, generator=g),
        "d.scalar": torch.tensor(2.5),
        "e.int": torch.arange(6, dtype=torch.int64).reshape(2, 3),
    }


@pytest.mark.parametrize("bucket_bytes", [1, 100, 1 << 30])
def test_round_trip_is_exact(bucket_bytes: int) -> None:
    state = _state()
    buckets = pack_buckets(state, bucket_bytes)
    out: dict[str, torch.Tensor] = {}
    for meta, flat in buckets:
        out.update(unpack_bucket(meta, flat))
    assert list(out) == list(state)
    for name, tensor in state.items():
        assert out[name].dtype == tensor.dtype and out[name].shape == tensor.shape
        assert torch.equal(out[name], tensor), name


def test_buckets_respect_the_limit_and_oversized_tensors_stand_alone() -> None:
    state = _state()
    limit = 200
    buckets = pack_buckets(state, limit)
    for meta, flat in buckets:
        assert flat.nbytes == sum(-(-m[3] // 16) * 16 for m in meta)
        assert flat.nbytes <= limit or len(meta) == 1  # only a single large tensor may exceed it
    assert any(m[0][0] == "c.big" and len(m) == 1 for m, _ in buckets)
    assert len(pack_buckets(state, 1 << 30)) == 1


def test_a_truncated_bucket_is_rejected() -> None:
    meta, flat = pack_buckets(_state(), 1 << 30)[0]
    with pytest.raises(ValueError, match="bytes"):
        unpack_bucket(meta, flat[:-4])
    with pytest.raises(ValueError, match="bucket_bytes"):
        pack_buckets(_state(), 0)
