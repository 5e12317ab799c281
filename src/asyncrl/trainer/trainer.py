"""The policy trainer: proximal log-probs, the packed policy-loss step, weight export, checkpoints.

One ``train_step(batch)`` is one training step of DESIGN §7: it starts from version ``i``
(``self.version``), recomputes the proximal log-probs with those weights (no grad, packed and
micro-batched exactly like training; skipped unless ``algo.prox_mode == "recompute"``), makes
``ppo_minibatches`` optimizer updates, and publishes version ``i + 1``. Each update runs its
mini-batch as padding-free packed micro-batches under ``max_tokens_per_micro_batch`` (or, as
the baseline, fixed-size padded micro-batches), spread over data-parallel ranks with balanced
token counts; the loss is the configured aggregation over the whole mini-batch, whatever the
split: every micro-batch's sum is divided by the mini-batch's global denominator, and FSDP
sums the ranks' gradients. Gradients are clipped to ``grad_clip``; an update whose loss or
gradient norm is not finite is skipped (not applied) and reported. The LR is a function of the
step index (linear warm-up, then constant / linear / cosine decay), so it needs no state.

Multi-rank (``trainer.distributed``): the model is FSDP2-sharded; each rank holds the whole
``TrainBatch`` and works on its share. Under ``run_distributed`` the rank-0 trainer leads and
every public call is mirrored on the other ranks.

Off-policy corrections chosen in ``algo`` reach the loss here: token masks by version gap and
M2PO's second-moment mask (computed over each whole PPO mini-batch before it is split, so the
split stays invisible), the behaviour-weight cap, and a KL penalty to the initial weights
(``algo.kl_coef > 0``: a frozen copy of the model, one more no-grad forward per micro-batch).

The trainer knows the loss, not the algorithm: advantages arrive computed in the samples.
Log-probs are of softmax(logits / temperature), the distribution the engine samples from.
Weight export (``export_weights``), HF saving and checkpoints live in ``trainer.state`` as
methods of the same class (``TrainerStateMixin``).
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from asyncrl.algo.aggregation import aggregate_loss
from asyncrl.algo.losses import kl_penalty, loglinear_prox_logp, policy_loss
from asyncrl.choices import ProxMode, choice_error
from asyncrl.config import AlgoConfig, TrainerConfig
from asyncrl.trainer import distributed as dist_mod
from asyncrl.trainer.attention import use_packed_attention
from asyncrl.trainer.bookkeeping import _Stats, denominator, lr_factor
from asyncrl.trainer.lora import apply_lora, base_model, is_lora
from asyncrl.trainer.offpolicy import drop_mask, m2_keep_rows
from asyncrl.trainer.packing import PackedMicroBatch, PaddedMicroBatch, pack, pad, plan_micro_batches
from asyncrl.trainer.state import TrainerStateMixin
from asyncrl.types import TrainBatch, TrainSample

MicroBatch = PackedMicroBatch | PaddedMicroBatch


@dataclass
class StepResult:
    """What one training step did."""

    version: int
    """The version published by this step (the step index + 1)."""
    applied: bool
    """False when an optimizer update of the step was skipped (non-finite loss or gradient). With
    one PPO mini-batch the weights are then untouched; with several, the finite ones applied."""
    metrics: dict[str, float]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class Trainer(TrainerStateMixin):
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
        tokenizer: Any = None,
        total_steps: int | None = None,
        _follower: bool = False,
    ) -> None:
        """``model``: a transformers causal LM (the trainer switches it to padding-free attention,
        wraps it with LoRA when ``lora_rank > 0`` and shards it under a multi-rank process group).
        ``tokenizer``: saved with checkpoints when given. ``total_steps``: the run's length, the
        LR decay horizon when ``train_cfg.decay_steps`` is 0."""
        self.cfg = train_cfg
        self.algo = algo_cfg
        self.temperature = temperature
        self.version = version
        self.tokenizer = tokenizer
        self.total_steps = total_steps
        self.skipped_steps = 0
        self.last_export: dict[str, float | str] = {}
        self.ctx = dist_mod.current_context()
        self.rank = self.ctx.rank if self.ctx else 0
        self.world_size = self.ctx.world_size if self.ctx else 1
        self.leader = self.ctx is not None and not _follower and dist_mod.is_leader()
        self.device = torch.device(device)
        if self.ctx is not None and self.ctx.device.type == "cuda":
            self.device = self.ctx.device
        dtype = next(model.parameters()).dtype
        if self.leader:
            assert self.ctx is not None
            kwargs = {
                "temperature": temperature,
                "device": self.device.type,
                "version": version,
                "total_steps": total_steps,
            }
            dist_mod.send_command(self.ctx, "init", dist_mod.init_payload(model, dtype, train_cfg, algo_cfg, kwargs))
        self._caller_model = model
        model.to(self.device)
        cuda = self.device.type == "cuda"
        self.bf16 = train_cfg.precision == "bf16" or (train_cfg.precision == "auto" and cuda)
        self.ref_model: Any = None
        if algo_cfg.kl_coef > 0:  # the reference policy: the initial weights, frozen (a full copy per rank)
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
            use_packed_attention(self.ref_model, self.device, torch.bfloat16 if self.bf16 else dtype)
        if train_cfg.lora_rank > 0:
            model = apply_lora(model, train_cfg)
        # the dtype attention computes in (flash attention needs half precision)
        self.attention = use_packed_attention(base_model(model), self.device, torch.bfloat16 if self.bf16 else dtype)
        checkpointing = train_cfg.activation_checkpointing
        if checkpointing if checkpointing is not None else cuda:
            hf = base_model(model)
            if hasattr(hf, "activation_checkpointing_enable"):  # transformers >= 5.2x
                hf.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model = model
        if self.ctx is not None:
            full = {k: v.detach() for k, v in model.state_dict().items()} if self.rank == 0 else {}
            dist_mod.shard_model(model, self.ctx, mixed_precision=self.bf16)
            dist_mod.load_full_state_dict(model, full)
            del full
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=train_cfg.lr,
            betas=train_cfg.betas,
            weight_decay=train_cfg.weight_decay,
        )
        self._set_lr(self.version)
        if (self.ctx is not None or is_lora(model)) and not _follower:
            self._route_caller_save()

    # ----------------------------------------------------------------- a follower rank
    @staticmethod
    def follower(payload: dict[str, Any]) -> Trainer:
        """A non-zero rank's trainer from the leader's ``init`` payload (``distributed.run_distributed``)."""
        model = dist_mod.build_follower_model(payload)
        return Trainer(model, payload["train_cfg"], payload["algo_cfg"], _follower=True, **payload["kwargs"])

    def follow(self, name: str, payload: Any) -> None:
        """The leader's command ``name`` on this rank's shard (``distributed.Follower``)."""
        match name:
            case "train_step":
                self._train_step(payload)
            case "compute_logprobs":
                self._compute_logprobs(payload)
            case "state_dict":
                self._full_state_dict()
            case "save_checkpoint":
                self._save_checkpoint(**payload)
            case "load_checkpoint":
                self._load_checkpoint(payload)
            case other:
                raise RuntimeError(f"follower got unknown command {other!r}")

    # ----------------------------------------------------------------- helpers
    @property
    def sharded(self) -> bool:
        return self.ctx is not None

    def _set_lr(self, step: int) -> float:
        lr = self.cfg.lr * lr_factor(step, self.cfg, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _autocast(self) -> contextlib.AbstractContextManager:
        # FSDP's mixed-precision policy casts the sharded model; a single process uses autocast
        if self.bf16 and not self.sharded:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _command(self, name: str, payload: Any = None) -> None:
        if self.leader:
            assert self.ctx is not None
            dist_mod.send_command(self.ctx, name, payload)

    @staticmethod
    def _check_samples(samples: Sequence[TrainSample]) -> None:
        for s in samples:
            if not s.token_ids:
                raise ValueError(f"sample {s.prompt_id}/{s.sample_idx} has no tokens")
            if s.loss_mask[0]:
                raise ValueError(f"sample {s.prompt_id}/{s.sample_idx}: the first token cannot carry loss")

    def _plan(self, lengths: Sequence[int]) -> list[list[int]]:
        """This rank's micro-batches (indices into ``lengths``); every rank gets the same count."""
        if self.cfg.micro_batching == "packed":
            return plan_micro_batches(
                lengths, self.cfg.max_tokens_per_micro_batch, world_size=self.world_size, method=self.cfg.balance
            )[self.rank]
        size = self.cfg.padded_micro_batch_size
        share = list(range(self.rank, len(lengths), self.world_size))
        if self.cfg.micro_batching == "padded_grouped":  # sorted buckets: neighbours in length pad together
            share.sort(key=lambda i: -lengths[i])
        count = _ceil_div(_ceil_div(len(lengths), self.world_size), size)
        bins = [share[k : k + size] for k in range(0, len(share), size)]
        return bins + [[] for _ in range(count - len(bins))]

    def _build(self, samples: Sequence[TrainSample], indices: Sequence[int]) -> MicroBatch:
        tokens = [samples[i].token_ids for i in indices]
        if self.cfg.micro_batching == "packed":
            return pack(tokens, indices, device=self.device)
        return pad(tokens, indices, device=self.device)

    def _token_logp(self, micro: MicroBatch) -> torch.Tensor:
        with self._autocast():
            logits = self.model(**micro.model_inputs()).logits
        return micro.token_logp(logits, self.temperature)

    def _dummy_pass(self, backward: bool) -> None:
        """A one-token pass for a rank with no sequence in this micro-batch slot (FSDP needs every
        rank in every forward/backward); contributes exactly zero gradient."""
        ids = torch.zeros((1, 1), dtype=torch.long, device=self.device)
        with self._autocast():
            logits = self.model(input_ids=ids, position_ids=torch.zeros_like(ids)).logits
        if backward:
            (logits.float().sum() * 0.0).backward()

    @contextlib.contextmanager
    def _eval_mode(self) -> Iterator[None]:
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            self.model.train(was_training)
            if self.sharded:
                # FSDP keeps the root's parameters unsharded after a forward (expecting a backward);
                # reshard so that parameters, state dicts and the optimizer see the shards again
                self.model.reshard()

    def _params(self) -> list[torch.nn.Parameter]:
        """The optimised parameters (the optimizer's own references: under FSDP the sharded ones)."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    # ----------------------------------------------------------------- log-probs
    def compute_logprobs(self, samples: Sequence[TrainSample]) -> list[torch.Tensor]:
        """Per-sample token log-probs under the current weights (no grad, packed like training);
        entry t of a sample is log p(token t | tokens < t), entry 0 is 0. The proximal log-probs
        when called at the start of a step."""
        samples = list(samples)
        self._command("compute_logprobs", samples)
        return self._compute_logprobs(samples)

    def _compute_logprobs(self, samples: Sequence[TrainSample]) -> list[torch.Tensor]:
        out = self._logprobs_local(samples, self._plan([len(s.token_ids) for s in samples]))
        if self.ctx is not None:
            merged: dict[int, torch.Tensor] = {}
            for part in self.ctx.all_gather_object({i: t.cpu() for i, t in out.items()}):
                merged.update(part)
            out = {i: t.to(self.device) for i, t in merged.items()}
        return [out[i] for i in range(len(samples))]

    def _logprobs_local(self, samples: Sequence[TrainSample], plan: list[list[int]]) -> dict[int, torch.Tensor]:
        out: dict[int, torch.Tensor] = {}
        with self._eval_mode():
            for indices in plan:
                if not indices:
                    self._dummy_pass(backward=False)
                    continue
                micro = self._build(samples, indices)
                logp = self._token_logp(micro).float()
                for index, row in zip(micro.sample_indices, micro.split_rows(logp), strict=True):
                    out[index] = row.detach().clone()
        return out

    # ----------------------------------------------------------------- the step
    def train_step(self, batch: TrainBatch) -> StepResult:
        """One training step on ``batch`` (trained at ``self.version``); publishes version + 1."""
        if batch.version != self.version:
            raise ValueError(f"batch packed for version {batch.version}, trainer is at {self.version}")
        if not batch.samples:
            raise ValueError("train_step needs a non-empty batch")
        self._check_samples(batch.samples)
        self._command("train_step", batch)
        return self._train_step(batch)

    def _train_step(self, batch: TrainBatch) -> StepResult:
        samples = list(batch.samples)
        t0 = time.perf_counter()
        lr = self._set_lr(self.version)
        lengths = [len(s.token_ids) for s in samples]
        n_mb = min(self.cfg.ppo_minibatches, len(samples))
        minibatches = [list(range(k, len(samples), n_mb)) for k in range(n_mb)]
        plans = [[[mb[j] for j in micro] for micro in self._plan([lengths[i] for i in mb])] for mb in minibatches]

        prox: dict[int, torch.Tensor] | None = None
        if self.algo.prox_mode == "recompute":
            prox = {}
            for plan in plans:
                prox.update(self._logprobs_local(samples, plan))
        t_prox = time.perf_counter() - t0

        self.model.train()
        params = self._params()
        stats = _Stats()
        losses: list[float] = []
        grad_norms: list[float] = []
        skipped = 0
        for mb, plan in zip(minibatches, plans, strict=True):
            self.optimizer.zero_grad(set_to_none=True)
            loss_sum = self._accumulate(samples, mb, plan, prox, stats)
            grad_norm = self._clip(params)
            grad_norms.append(grad_norm)
            if not (math.isfinite(loss_sum) and math.isfinite(grad_norm)):
                self.optimizer.zero_grad(set_to_none=True)
                skipped += 1
                continue
            self.optimizer.step()
            losses.append(loss_sum)
        self.optimizer.zero_grad(set_to_none=True)
        if self.ctx is not None:
            stats = _Stats.merge(self.ctx.all_gather_object(stats))
        sums, maxima, weight = stats.sums, stats.maxima, stats.weight
        applied = skipped == 0
        if not applied:
            self.skipped_steps += 1
        self.version += 1
        out = {k: v / max(weight, 1.0) for k, v in sums.items()}
        out.update(maxima)
        out.update(
            loss=sum(losses) / len(losses) if losses else float("nan"),
            grad_norm=max(grad_norms) if grad_norms else float("nan"),
            lr=lr,
            prox_time_s=t_prox,
            step_time_s=time.perf_counter() - t0,
            trained_tokens=float(sum(lengths)),
            trained_loss_tokens=float(sum(s.num_loss_tokens for s in samples)),
            micro_batches=float(stats.micro_batches),
            skipped=0.0 if applied else 1.0,
            skipped_updates=float(skipped),
        )
        return StepResult(version=self.version, applied=applied, metrics=out)

    def accumulate_gradients(self, samples: Sequence[TrainSample]) -> float:
        """Forward/backward ``samples`` as ONE mini-batch (packed micro-batches, global
        denominator, proximal log-probs per ``algo.prox_mode``) into fresh ``.grad`` buffers;
        no optimizer step, no version change. Returns the mini-batch loss. This is exactly the
        gradient ``train_step`` would apply (before clipping); for tests and diagnostics."""
        samples = list(samples)
        self._check_samples(samples)
        plan = self._plan([len(s.token_ids) for s in samples])
        prox = self._logprobs_local(samples, plan) if self.algo.prox_mode == "recompute" else None
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        return self._accumulate(samples, list(range(len(samples))), plan, prox, _Stats())

    def _accumulate(
        self,
        samples: Sequence[TrainSample],
        minibatch: Sequence[int],
        plan: list[list[int]],
        prox: dict[int, torch.Tensor] | None,
        stats: _Stats,
    ) -> float:
        """Backward every micro-batch of this rank's share of ``minibatch``; the loss of the
        whole mini-batch (summed over ranks)."""
        denom = denominator([samples[i] for i in minibatch], self.algo.aggregation)
        m2 = m2_keep_rows(samples, minibatch, prox, self.algo.m2_threshold, self.ctx)
        loss_sum = 0.0
        for indices in plan:
            stats.micro_batches += 1
            if not indices:
                self._dummy_pass(backward=True)
                continue
            loss, metrics = self._micro_loss(samples, indices, prox, denom, m2)
            loss.backward()
            loss_sum += float(loss.detach())
            stats.add(metrics)
        if self.ctx is not None:
            loss_sum = self.ctx.all_reduce([loss_sum])[0]
        return loss_sum

    def _clip(self, params: list[torch.nn.Parameter]) -> float:
        """Clip the global gradient norm to ``grad_clip``; returns the norm before clipping.

        Under FSDP every rank holds shards (``DTensor``): the squared norms of the local shards
        are summed over ranks, so every rank scales by the same coefficient."""
        shards: list[torch.Tensor] = []
        counted: list[torch.Tensor] = []
        for p in params:
            if p.grad is None:
                continue
            grad = p.grad
            if hasattr(grad, "to_local"):
                local = grad.to_local()
                shards.append(local)
                if self.rank == 0 or any(pl.is_shard() for pl in grad.placements):
                    counted.append(local)
            else:
                shards.append(grad)
                counted.append(grad)
        square = sum((g.detach().float().pow(2).sum() for g in counted), torch.zeros((), device=self.device))
        total = float(square)
        if self.ctx is not None:
            total = self.ctx.all_reduce([total])[0]
        norm = math.sqrt(total) if math.isfinite(total) else float("nan")
        coef = self.cfg.grad_clip / (norm + 1e-6)
        if math.isfinite(norm) and coef < 1.0:
            for g in shards:
                g.mul_(coef)
        return norm

    def _kl_term(
        self, micro: MicroBatch, logp: torch.Tensor, mask: torch.Tensor, denom: float
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``kl_coef`` x the aggregated KL estimate to the frozen initial weights, and its token mean."""
        with torch.no_grad(), self._autocast():
            ref_logp = micro.token_logp(self.ref_model(**micro.model_inputs()).logits, self.temperature)
        per_token = kl_penalty(logp.float(), ref_logp.float(), self.algo.kl_estimator)
        kl = aggregate_loss(per_token, mask, self.algo.aggregation, denom, **micro.loss_kwargs())
        live = mask != 0
        mean = float(torch.where(live, per_token.detach(), 0.0).sum()) / float(live.sum().clamp(min=1))
        return self.algo.kl_coef * kl, {"kl_ref": mean}

    def _micro_loss(
        self,
        samples: Sequence[TrainSample],
        indices: Sequence[int],
        prox: dict[int, torch.Tensor] | None,
        denom: float,
        m2: tuple[dict[int, torch.Tensor], dict[str, float]] | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        micro = self._build(samples, indices)
        rows = [samples[i] for i in indices]
        logp = self._token_logp(micro)
        behav = micro.cat_rows([s.behav_logprobs for s in rows])
        adv = micro.cat_rows([s.advantages for s in rows])
        mask = micro.cat_rows([s.loss_mask for s in rows])
        keep_m2 = [m2[0][i] for i in indices] if m2 else None
        drop, extra = drop_mask(micro, rows, keep_m2, mask, self.version, self.algo.max_version_gap)
        if m2 is not None:
            extra.update(m2[1])
        match self.algo.prox_mode:
            case "recompute":
                assert prox is not None
                prox_logp = micro.cat_rows([prox[i] for i in indices])
            case "behav":
                prox_logp = behav
            case "loglinear":
                versions = micro.cat_rows([s.versions for s in rows], dtype=torch.long, fill=-1)
                # the proximal policy is version i = self.version; the weights being optimised are v_θ = i + 1
                prox_logp = loglinear_prox_logp(behav, logp.detach(), versions, self.version + 1, loss_mask=mask)
            case other:
                raise choice_error(other, ProxMode, "prox_mode")
        loss, metrics = policy_loss(
            logp,
            prox_logp,
            behav,
            adv,
            mask,
            eps_clip=self.algo.eps_clip,
            eps_clip_high=self.algo.eps_clip_high,
            dual_clip=self.algo.dual_clip,
            behav_cap=self.algo.behav_cap,
            behav_weight=self.algo.behav_weight,
            behav_cap_mode=self.algo.behav_cap_mode,
            behav_cap_level=self.algo.behav_cap_level,
            aggregation=self.algo.aggregation,
            loss_type=self.algo.loss_type,
            denominator=denom,
            drop=drop,
            **micro.loss_kwargs(),
        )
        metrics.update(extra)
        if self.ref_model is not None:
            kl, kl_metrics = self._kl_term(micro, logp, mask, denom)
            loss = loss + kl
            metrics.update(kl_metrics)
        return loss, metrics
