"""The policy trainer: proximal log-probs, the packed policy-loss step, weight export.

One ``train_step(batch)`` is one training step of DESIGN §7: it starts from version ``i``
(``self.version``), recomputes the proximal log-probs with those weights (no grad, packed like
training), makes ``ppo_minibatches`` optimizer updates over packed, padding-free micro-batches
(the loss is the configured aggregation over the whole mini-batch, whatever the split: each
micro-batch's sum is divided by the global denominator), and publishes version ``i + 1``.
A step whose loss or gradient norm is not finite is skipped (weights untouched, reported).

The trainer knows the loss, not the algorithm: advantages arrive computed in the samples.
Log-probs are of softmax(logits / temperature), the distribution the engine samples from.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from asyncrl.algo.losses import loglinear_prox_logp, policy_loss
from asyncrl.config import AlgoConfig, TrainerConfig
from asyncrl.trainer.packing import PackedMicroBatch, pack, split_micro_batches, token_logprobs
from asyncrl.types import TrainBatch, TrainSample, WeightUpdate


@dataclass
class StepResult:
    """What one training step did."""

    version: int
    """The version published by this step (the step index + 1)."""
    applied: bool
    """False when the step was skipped (non-finite loss or gradient)."""
    metrics: dict[str, float]


def _denominator(samples: Sequence[TrainSample], aggregation: str) -> float:
    """The global loss denominator of a mini-batch for ``aggregation`` (see algo.losses)."""
    match aggregation:
        case "token_mean":
            return float(max(1, sum(s.num_loss_tokens for s in samples)))
        case "seq_mean_token_mean":
            return float(max(1, sum(1 for s in samples if s.num_loss_tokens > 0)))
        case "seq_mean_token_sum":
            return float(max(1, len(samples) * max(len(s.token_ids) for s in samples)))
        case _:
            raise ValueError(f"unknown aggregation {aggregation!r}")


class Trainer:
    """Owns the policy weights being optimised, the optimizer and the version counter."""

    def __init__(
        self,
        model: Any,
        train_cfg: TrainerConfig,
        algo_cfg: AlgoConfig,
        *,
        temperature: float = 1.0,
        device: str = "cpu",
        version: int = 0,
    ) -> None:
        self.model = model
        self.cfg = train_cfg
        self.algo = algo_cfg
        self.temperature = temperature
        self.device = device
        self.version = version
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=train_cfg.lr,
            betas=train_cfg.betas,
            weight_decay=train_cfg.weight_decay,
        )
        warmup = max(1, train_cfg.warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: min(1.0, (step + 1) / warmup))
        self.skipped_steps = 0

    # ----------------------------------------------------------------- forward passes
    def _micro_batches(self, samples: Sequence[TrainSample]) -> list[PackedMicroBatch]:
        groups = split_micro_batches([len(s.token_ids) for s in samples], self.cfg.max_tokens_per_micro_batch)
        return [pack([samples[i].token_ids for i in g], g, device=self.device) for g in groups]

    def _forward_logp(self, micro: PackedMicroBatch) -> torch.Tensor:
        """``[B, T]`` log-prob of each token of each packed sequence (column 0 is 0)."""
        logits = self.model(
            input_ids=micro.input_ids, position_ids=micro.position_ids, attention_mask=micro.attention_mask
        ).logits[0]
        per_position = token_logprobs(logits, micro.input_ids[0], self.temperature)
        return micro.gather_token_values(per_position)

    @torch.no_grad()
    def compute_logprobs(self, samples: Sequence[TrainSample]) -> list[torch.Tensor]:
        """Per-sample token log-probs under the current weights (no grad, packed): the proximal
        log-probs when called at the start of a step."""
        was_training = self.model.training
        self.model.eval()
        out: list[torch.Tensor | None] = [None] * len(samples)
        for micro in self._micro_batches(samples):
            logp = self._forward_logp(micro)
            for row, index in enumerate(micro.sample_indices):
                out[index] = logp[row, : micro.seq_lens[row]].detach().clone()
        self.model.train(was_training)
        return [t for t in out if t is not None]

    # ----------------------------------------------------------------- the step
    def train_step(self, batch: TrainBatch) -> StepResult:
        """One training step on ``batch`` (trained at ``self.version``); publishes version + 1."""
        if batch.version != self.version:
            raise ValueError(f"batch packed for version {batch.version}, trainer is at {self.version}")
        samples = list(batch.samples)
        if not samples:
            raise ValueError("train_step needs a non-empty batch")
        t0 = time.perf_counter()
        prox: list[torch.Tensor] | None = None
        if self.algo.prox_mode == "recompute":
            prox = self.compute_logprobs(samples)
        t_prox = time.perf_counter() - t0

        self.model.train()
        n_mb = min(self.cfg.ppo_minibatches, len(samples))
        minibatches = [list(range(k, len(samples), n_mb)) for k in range(n_mb)]
        totals: dict[str, float] = {}
        weight_sum = 0.0
        applied = True
        grad_norms: list[float] = []
        losses: list[float] = []
        for indices in minibatches:
            sub = [samples[i] for i in indices]
            sub_prox = [prox[i] for i in indices] if prox is not None else None
            denominator = _denominator(sub, self.algo.aggregation)
            self.optimizer.zero_grad(set_to_none=True)
            loss_sum = 0.0
            for micro in self._micro_batches(sub):
                loss, metrics = self._micro_loss(micro, sub, sub_prox, denominator)
                loss.backward()
                loss_sum += float(loss.detach())
                w = float(sum(sub[i].num_loss_tokens for i in micro.sample_indices))
                for k, v in metrics.items():
                    totals[k] = totals.get(k, 0.0) + w * float(v)
                weight_sum += w
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
            grad_norms.append(float(grad_norm))
            if not (math.isfinite(loss_sum) and math.isfinite(float(grad_norm))):
                self.optimizer.zero_grad(set_to_none=True)
                applied = False
                break
            self.optimizer.step()
            losses.append(loss_sum)
        if applied:
            self.scheduler.step()
        else:
            self.skipped_steps += 1
        self.version += 1
        metrics = {k: v / max(weight_sum, 1.0) for k, v in totals.items()}
        metrics["loss"] = sum(losses) / len(losses) if losses else float("nan")
        metrics.update(
            grad_norm=max(grad_norms) if grad_norms else float("nan"),
            lr=float(self.scheduler.get_last_lr()[0]),
            prox_time_s=t_prox,
            step_time_s=time.perf_counter() - t0,
            trained_tokens=float(sum(len(s.token_ids) for s in samples)),
            trained_loss_tokens=float(sum(s.num_loss_tokens for s in samples)),
            skipped=0.0 if applied else 1.0,
        )
        return StepResult(version=self.version, applied=applied, metrics=metrics)

    def _micro_loss(
        self,
        micro: PackedMicroBatch,
        samples: Sequence[TrainSample],
        prox: Sequence[torch.Tensor] | None,
        denominator: float,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        rows = [samples[i] for i in micro.sample_indices]
        logp = self._forward_logp(micro)
        behav = micro.pad_rows([s.behav_logprobs for s in rows])
        adv = micro.pad_rows([s.advantages for s in rows])
        mask = micro.pad_rows([s.loss_mask for s in rows])
        match self.algo.prox_mode:
            case "recompute":
                assert prox is not None
                prox_logp = micro.pad_rows([prox[i].tolist() for i in micro.sample_indices])
            case "behav":
                prox_logp = behav
            case "loglinear":
                versions = micro.pad_rows([s.versions for s in rows], fill=-1, dtype=torch.long)
                # the proximal policy is version i = self.version; the weights being optimised are v_θ = i + 1
                prox_logp = loglinear_prox_logp(behav, logp.detach(), versions, self.version + 1, loss_mask=mask)
            case other:
                raise ValueError(f"unknown prox_mode {other!r}")
        return policy_loss(
            logp,
            prox_logp,
            behav,
            adv,
            mask,
            eps_clip=self.algo.eps_clip,
            eps_clip_high=self.algo.eps_clip_high,
            dual_clip=self.algo.dual_clip,
            behav_cap=self.algo.behav_cap,
            behav_cap_mode=self.algo.behav_cap_mode,
            behav_cap_level=self.algo.behav_cap_level,
            aggregation=self.algo.aggregation,
            loss_type=self.algo.loss_type,
            denominator=denominator,
        )

    # ----------------------------------------------------------------- export
    def export_weights(self) -> WeightUpdate:
        """The current weights as an in-process update for the engines (private copies)."""
        tensors = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return WeightUpdate(version=self.version, tensors=tensors)
