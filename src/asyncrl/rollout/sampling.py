"""Token sampling for ``LocalEngine``: ``SamplingParams`` and one vectorised sampler for all slots.

The behaviour log-prob of a sampled token is ``log_softmax(logits / temperature)[token]``, computed
BEFORE top-p/top-k truncation: that is the distribution the trainer recomputes from
``model(input_ids).logits`` (no renormalisation over the truncated support). Greedy requests (or
``temperature <= 0``) take the argmax; their log-prob is under ``softmax(logits / temperature)``
with ``temperature <= 0`` read as 1, i.e. plain ``log_softmax(logits)`` at the default.

Randomness is counter-based: the draw for a token is a hash of (the sample's seed, the token's
absolute position in the sequence), then inverse-CDF sampling. So a seeded sample does not depend
on what else shares the batch, and a sample resubmitted after an interruption (prompt + partial
output, same seed) draws the same numbers at the same positions: with unchanged weights an
interrupted seeded generation equals the uninterrupted one, not only a greedy one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SEED_MOD = 1 << 31


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request (all samples of a group share it)."""

    max_new_tokens: int
    """Budget of generated tokens (the stop token counts). No default: a run's is ``rollout.max_new_tokens``
    (``eval.max_new_tokens`` when evaluating), a server's the request's."""
    temperature: float = 1.0
    """Logits are divided by this; ``<= 0`` means greedy."""
    top_p: float = 1.0
    """Nucleus truncation of the tempered distribution (1.0 = off)."""
    top_k: int = 0
    """Keep the k most likely tokens (0 = off)."""
    greedy: bool = False
    """Argmax; log-probs still of ``softmax(logits / temperature)`` (temperature <= 0 read as 1)."""
    stop_token_ids: tuple[int, ...] = ()
    """Sampling one of these ends the sample with ``finish_reason="stop"`` (the token is kept)."""
    seed: int | None = None
    """Sample i of a request uses seed ``(seed + i) mod 2**31``; None draws a fresh random seed."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k!r}")

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature <= 0.0

    @property
    def logprob_temperature(self) -> float:
        """The temperature of the behaviour distribution (what the trainer must divide by)."""
        return self.temperature if self.temperature > 0.0 else 1.0


_IDLE = SamplingParams(max_new_tokens=1, greedy=True)


def uniform_from(seed: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Deterministic uniforms in (0, 1) from int64 ``seed`` (< 2**31) and ``pos`` (< 2**31), float64.

    A small integer hash kept below 2**62 so that int64 products never overflow (CPU and CUDA)."""
    m = SEED_MOD - 1
    x = (seed * 0x2545F491 + pos * 0x1B873593 + 0x632BE5AB) & m
    x = ((x ^ (x >> 15)) * 0x2C1B3C6D) & m
    x = ((x ^ (x >> 12)) * 0x297A2D39) & m
    x = ((x ^ (x >> 15)) * 0x3C6EF372) & m
    x = x ^ (x >> 13)
    return (x.double() + 0.5) / SEED_MOD


@dataclass
class SlotParams:
    """Per-slot sampling parameters as device tensors (rebuilt when the set of samples changes)."""

    inv_temp: torch.Tensor  # [n, 1] float32: 1 / logprob temperature
    greedy: torch.Tensor  # [n] bool
    top_p: torch.Tensor  # [n, 1] float64
    top_k: torch.Tensor  # [n, 1] int64 (vocab size where off)
    seed: torch.Tensor  # [n] int64
    any_greedy: bool
    all_greedy: bool
    any_truncation: bool
    all_temp_one: bool

    @staticmethod
    def build(params: list[SamplingParams | None], seeds: list[int], vocab: int, device: torch.device):
        """Parameters for rows; ``None`` rows (idle slots) sample greedily and are ignored."""
        temps, greedy, top_p, top_k = [], [], [], []
        for p in params:
            p = p if p is not None else _IDLE
            temps.append(p.logprob_temperature)
            greedy.append(p.is_greedy)
            top_p.append(p.top_p)
            top_k.append(p.top_k if 0 < p.top_k < vocab else vocab)
        live = [(g, tp, tk) for p, g, tp, tk in zip(params, greedy, top_p, top_k, strict=True) if p is not None]
        return SlotParams(
            inv_temp=torch.tensor([1.0 / t for t in temps], dtype=torch.float32, device=device)[:, None],
            greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            top_p=torch.tensor(top_p, dtype=torch.float64, device=device)[:, None],
            top_k=torch.tensor(top_k, dtype=torch.long, device=device)[:, None],
            seed=torch.tensor(seeds, dtype=torch.long, device=device),
            any_greedy=any(g for g, _, _ in live),
            all_greedy=all(g for g, _, _ in live),
            any_truncation=any((not g) and (tp < 1.0 or tk < vocab) for g, tp, tk in live),
            all_temp_one=all(t == 1.0 for t in temps),
        )


def sample(logits: torch.Tensor, sp: SlotParams, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of ``logits`` [n, V] (float32); ``positions`` [n] are the absolute
    positions of the tokens being sampled. Returns (tokens [n] int64, behaviour log-probs [n] float32)."""
    scaled = logits if sp.all_temp_one else logits * sp.inv_temp
    logp = torch.log_softmax(scaled, dim=-1)
    if sp.all_greedy:
        tok = torch.argmax(logits, dim=-1)
        return tok, logp.gather(1, tok[:, None])[:, 0]
    u = uniform_from(sp.seed, positions)[:, None]  # [n, 1]
    if sp.any_truncation:
        sorted_logp, order = torch.sort(logp, dim=-1, descending=True)
        p = sorted_logp.double().exp()
        cum = p.cumsum(-1)
        ranks = torch.arange(p.shape[-1], device=p.device)[None, :]
        keep = ((cum - p) < sp.top_p) & (ranks < sp.top_k)  # the top token is always kept
        cdf = (p * keep).cumsum(-1)
        j = torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_(max=p.shape[-1] - 1)
        tok = order.gather(1, j)[:, 0]
    else:
        cdf = logp.double().exp().cumsum(-1)
        tok = torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_(max=logits.shape[-1] - 1)[:, 0]
    if sp.any_greedy:
        tok = torch.where(sp.greedy, torch.argmax(logits, dim=-1), tok)
    return tok, logp.gather(1, tok[:, None])[:, 0]
