"""Whether the engine's KV cache fits in memory, checked before it is allocated (issue 14 item 4).

Owns ``kv_cache_bytes`` (the size of ``SlotKVForward``'s preallocated cache: K and V, each
``[layers, slots + 1, kv_heads, max_seq_len, head_dim]``), ``available_bytes(device)`` (CPU:
``MemAvailable`` of ``/proc/meminfo``, or psutil's, capped by the cgroup's memory limit; CUDA:
``torch.cuda.mem_get_info``'s free bytes) and ``check_kv_fits``, which raises ``KVCacheTooLarge``
naming what the cache needs, what is available and the settings that size it. An engine asked for
more than memory allows thus fails at start with that message, instead of being killed by the kernel
(or failing a CUDA allocation) later. A device whose free memory cannot be read is not checked.
"""

from __future__ import annotations

from pathlib import Path

import torch

HEADROOM = 0.9
"""The cache may take at most this share of the available memory (the rest: activations, logits,
the sampler, the Python heap)."""
_CGROUP_FILES = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),  # v1
)


class KVCacheTooLarge(MemoryError):
    """The KV cache asked for does not fit in the memory available on its device."""


def kv_cache_bytes(
    *, layers: int, slots: int, kv_heads: int, max_seq_len: int, head_dim: int, dtype: torch.dtype
) -> int:
    """Bytes of K plus V for ``slots`` slots (the caller counts the scratch slot)."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * layers * slots * kv_heads * max_seq_len * head_dim * element


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - psutil missing or unsupported here: no CPU figure
        return None


def _cgroup_available() -> int | None:
    """What the cgroup's memory limit leaves (None: no limit, or not Linux)."""
    for limit_file, usage_file in _CGROUP_FILES:
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 1 << 60:  # v1 writes "no limit" as a huge number
            return None
        return max(0, int(limit) - usage)
    return None


def available_bytes(device: str | torch.device) -> tuple[int, str] | None:
    """(bytes available on ``device``, where the figure comes from); None when it cannot be known."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return None
        free, _total = torch.cuda.mem_get_info(dev)
        return int(free), f"free memory of {dev} (torch.cuda.mem_get_info)"
    if dev.type != "cpu":
        return None
    candidates = ((_meminfo_available(), "MemAvailable"), (_cgroup_available(), "cgroup limit"))
    known = [(n, src) for n, src in candidates if n is not None]
    if not known:
        return None
    n, src = min(known)
    return n, f"{src} of this machine's memory"


def check_kv_fits(
    *,
    layers: int,
    slots: int,
    kv_heads: int,
    max_seq_len: int,
    head_dim: int,
    dtype: torch.dtype,
    device: str | torch.device,
) -> None:
    """Raise ``KVCacheTooLarge`` unless the KV cache of these dimensions (``slots`` counts the
    scratch slot) fits in ``HEADROOM`` of the memory available on ``device``."""
    need = kv_cache_bytes(
        layers=layers, slots=slots, kv_heads=kv_heads, max_seq_len=max_seq_len, head_dim=head_dim, dtype=dtype
    )
    found = available_bytes(device)
    if found is None:
        return
    available, source = found
    if need <= HEADROOM * available:
        return
    element = torch.empty((), dtype=dtype).element_size()
    raise KVCacheTooLarge(
        f"the engine's KV cache does not fit on {torch.device(device)}: it needs {_gib(need)} "
        f"(2 (K and V) x {layers} layers x {slots} slots (max_slots + 1 scratch) x {kv_heads} KV heads x "
        f"max_seq_len {max_seq_len} x head_dim {head_dim} x {element} bytes ({dtype})), but only {_gib(available)} "
        f"is available ({source}; the cache may take {HEADROOM:.0%} of it). Lower rollout.max_slots, or "
        "max_seq_len (rollout.max_prompt_len + the larger of rollout.max_new_tokens and eval.max_new_tokens)."
    )
