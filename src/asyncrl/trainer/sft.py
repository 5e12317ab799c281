"""Supervised fine-tuning on demonstrations (the warm start before RL).

Packs examples padding-free like the RL trainer (varlen attention per sequence, see
``trainer.attention``) and minimises the token-mean negative log-likelihood of the tokens under each
example's loss mask (a single-turn demonstration: its response, ``prompt_response_example``; a
multi-turn one: the model's turns, environment tokens being context only). The model's attention
implementation is restored after. ``abandon_above`` stops a stage early whose loss shows it has not taken
(the warm start's restarts, ``launch.warm_start``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

import torch
from tqdm import tqdm

from asyncrl.config import SFTConfig
from asyncrl.trainer.attention import use_packed_attention
from asyncrl.trainer.packing import pack, split_micro_batches

SFTExample = tuple[Sequence[int], Sequence[int]]
"""``(token ids, loss mask)`` of one demonstration: mask 1 on the tokens the model must learn to write."""


def prompt_response_example(prompt_ids: Sequence[int], response_ids: Sequence[int]) -> SFTExample:
    """A single-turn demonstration: the prompt is context, the response (EOS included) is learned."""
    return tuple(prompt_ids) + tuple(response_ids), (0,) * len(prompt_ids) + (1,) * len(response_ids)


def sft_train(
    model: Any,
    examples: Sequence[SFTExample],
    cfg: SFTConfig,
    *,
    device: str = "cpu",
    max_tokens_per_micro_batch: int = 1024,
    progress: bool = True,
    abandon_above: tuple[int, float] | None = None,
    stop_below: float = 0.0,
) -> dict[str, float]:
    """Train ``model`` in place for ``cfg.steps`` steps of ``cfg.batch_size`` examples.

    ``examples`` are ``(ids, loss_mask)`` (``prompt_response_example`` for single-turn ones).
    Returns the final smoothed loss, the token count and the wall time. ``abandon_above=(step, loss)``:
    stop after ``step`` steps when the smoothed loss is then above ``loss`` (the stats carry
    ``sft_abandoned_at``: the steps taken). ``stop_below`` > 0: stop, done, once the smoothed loss falls below it
    after the warm-up (the stats carry ``sft_stopped_at``: the steps taken)."""
    if not examples:
        raise ValueError("sft_train needs at least one example")
    for ids, mask in examples:
        if len(ids) != len(mask) or not any(mask):
            raise ValueError("sft_train: each example needs a loss mask as long as its ids, with a 1 in it")
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    previous_attention = model.config._attn_implementation
    use_packed_attention(model, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, cfg.warmup_steps)

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        remaining = max(1, cfg.steps - warmup)
        return max(0.05, 1.0 - (step - warmup) / remaining)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    model.train()
    order = list(range(len(examples)))
    rng.shuffle(order)
    cursor = 0
    smoothed = None
    tokens = 0
    t0 = time.perf_counter()
    bar = tqdm(range(cfg.steps), desc="sft", disable=not progress, dynamic_ncols=True)
    abandoned_at = stopped_at = None
    for step in bar:
        if abandon_above and step == abandon_above[0] and smoothed is not None and smoothed > abandon_above[1]:
            abandoned_at = step
            break
        if cursor + cfg.batch_size > len(order):
            rng.shuffle(order)
            cursor = 0
        chosen = [examples[i] for i in order[cursor : cursor + cfg.batch_size]]
        cursor += cfg.batch_size
        seqs = [list(ids) for ids, _ in chosen]
        n_target = sum(sum(mask) for _, mask in chosen)
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for group in split_micro_batches([len(s) for s in seqs], max_tokens_per_micro_batch):
            micro = pack([seqs[i] for i in group], group, device=device)
            logp = micro.token_logp(model(**micro.model_inputs()).logits)
            mask = micro.cat_rows([list(chosen[i][1]) for i in group])
            loss = -(logp * mask).sum() / n_target
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        tokens += sum(len(s) for s in seqs)
        smoothed = total if smoothed is None else 0.95 * smoothed + 0.05 * total
        bar.set_postfix(loss=f"{smoothed:.3f}")
        if stop_below > 0 and step + 1 >= warmup and smoothed < stop_below:
            stopped_at = step + 1
            break
    model.eval()
    model.set_attn_implementation(previous_attention)
    bar.close()
    stats = {"sft_loss": float(smoothed or 0.0), "sft_tokens": float(tokens), "sft_wall_s": time.perf_counter() - t0}
    if stopped_at is not None:
        stats["sft_stopped_at"] = float(stopped_at)
    return stats if abandoned_at is None else {**stats, "sft_abandoned_at": float(abandoned_at)}
