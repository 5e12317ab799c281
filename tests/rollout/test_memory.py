"""An engine asked for more KV cache than memory allows fails at start with the numbers (issue 14
item 4): ``rollout.memory.check_kv_fits`` runs before ``SlotKVForward`` allocates its cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncrl import cli
from asyncrl.rollout import memory
from asyncrl.rollout.engine import LocalEngine
from asyncrl.rollout.memory import KVCacheTooLarge, available_bytes, check_kv_fits, kv_cache_bytes


def test_the_size_is_k_and_v_over_every_dimension() -> None:
    n = kv_cache_bytes(layers=2, slots=5, kv_heads=3, max_seq_len=7, head_dim=11, dtype=torch.bfloat16)
    assert n == 2 * 2 * 5 * 3 * 7 * 11 * 2


def test_an_absurd_cache_fails_at_start_with_what_it_needs_and_has(load_tiny) -> None:
    model, tok = load_tiny()
    have = available_bytes("cpu")
    assert have is not None and have[0] > 0  # Linux: MemAvailable (or the cgroup's limit)
    with pytest.raises(KVCacheTooLarge) as info:  # 10^6 slots x 10^5 tokens: petabytes, refused before allocating
        LocalEngine(model, tok, max_slots=1_000_000, max_seq_len=100_000)
    text = str(info.value)
    cfg = model.config
    need = kv_cache_bytes(
        layers=cfg.num_hidden_layers,
        slots=1_000_001,
        kv_heads=cfg.num_key_value_heads,
        max_seq_len=100_000,
        head_dim=cfg.hidden_size // cfg.num_attention_heads,
        dtype=torch.float32,
    )
    assert text.startswith(f"the engine's KV cache does not fit on cpu: it needs {need / 2**30:.2f} GiB (")
    assert "1000001 slots (max_slots + 1 scratch)" in text and "max_seq_len 100000" in text
    assert "but only " in text and "GiB is available (" in text and "Lower rollout.max_slots" in text
    LocalEngine(model, tok, max_slots=4, max_seq_len=64).close()  # a sane size still starts


def test_the_cgroup_limit_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "max").write_text(f"{2**30}\n")
    (tmp_path / "current").write_text(f"{2**29}\n")
    monkeypatch.setattr(memory, "_CGROUP_FILES", ((str(tmp_path / "max"), str(tmp_path / "current")),))
    monkeypatch.setattr(memory, "_meminfo_available", lambda: 64 * 2**30)
    assert available_bytes("cpu") == (2**29, "cgroup limit of this machine's memory")
    (tmp_path / "max").write_text("max\n")  # no limit
    assert available_bytes("cpu") == (64 * 2**30, "MemAvailable of this machine's memory")
    with pytest.raises(KVCacheTooLarge, match=r"needs 64.00 GiB .* only 64.00 GiB is available \(MemAvailable"):
        check_kv_fits(layers=1, slots=1, kv_heads=1, max_seq_len=2**31, head_dim=8, dtype=torch.float16, device="cpu")


def test_cuda_uses_the_free_device_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 * 2**30, 80 * 2**30))
    check_kv_fits(
        layers=1, slots=1, kv_heads=1, max_seq_len=2**20, head_dim=64, dtype=torch.bfloat16, device="cuda:0"
    )  # 256 MiB: fits
    with pytest.raises(KVCacheTooLarge, match=r"on cuda:0: it needs 4.00 GiB .* only 2.00 GiB .*mem_get_info"):
        check_kv_fits(
            layers=16, slots=1, kv_heads=1, max_seq_len=2**20, head_dim=64, dtype=torch.bfloat16, device="cuda:0"
        )


def test_unknown_memory_is_not_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    check_kv_fits(layers=1, slots=1, kv_heads=1, max_seq_len=2**40, head_dim=1, dtype=torch.float32, device="cuda")


def test_the_cli_prints_it_without_a_traceback(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    def cmd_train(args: object) -> int:
        check_kv_fits(layers=1, slots=1, kv_heads=1, max_seq_len=2**50, head_dim=1, dtype=torch.float32, device="cpu")
        return 0

    monkeypatch.setattr(cli.train, "run", cmd_train)
    assert cli.main(["train"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("asyncrl: the engine's KV cache does not fit on cpu: it needs ") and "Traceback" not in err
