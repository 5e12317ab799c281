"""The learning sections of the config tree (``algo``: advantages, the policy loss and its off-policy
corrections; ``trainer``: the optimizer, micro-batching, precision, weight export). Imported as
``from asyncrl.config import AlgoConfig``; every field documented under its declaration
(``tests/test_config_fields.py`` reads this file too).
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.choices import (
    AdvantageEstimator,
    Aggregation,
    BalanceMethod,
    BehavCapLevel,
    BehavCapMode,
    KLEstimator,
    LossType,
    LRSchedule,
    MicroBatching,
    Precision,
    ProxMode,
    WeightTransport,
)

__all__ = ["AlgoConfig", "TrainerConfig"]


@dataclass(frozen=True)
class AlgoConfig:
    """The objective (DESIGN §5): advantages, the policy loss and its off-policy corrections."""

    advantage: AdvantageEstimator = "grpo"
    """grpo | dr_grpo | rloo | reinforce_pp."""
    reward_scale: float = 1.0
    """Advantages are computed from ``(reward + reward_bias) * reward_scale`` (the ledger keeps the raw reward)."""
    reward_bias: float = 0.0
    """Added to every reward before ``reward_scale`` (see there)."""
    batch_normalize: bool = False
    """Normalise advantages over the whole batch after the group estimator."""
    loss_type: LossType = "ppo"
    """ppo (decoupled when prox_mode != behav) | gspo | cispo | pg (the plain policy gradient
    ``-A·logp``, no ratio and no clip; with prox_mode=behav and behav_cap=null it applies no
    off-policy correction at all: the "no correction" arm of ``python -m benchmarks ablation``)."""
    prox_mode: ProxMode = "recompute"
    """recompute (extra forward pass with pre-update weights: decoupled PPO) | loglinear
    (approximate from stored versions) | behav (naive PPO: the behaviour policy is the clip centre)."""
    eps_clip: float = 0.2
    """ε: the ratio is clipped to [1 - ε, 1 + ε_high] (GSPO wants a much smaller one, ~3e-4)."""
    eps_clip_high: float | None = None
    """ε_high, the upper clip bound's (DAPO's clip-higher); null: ``eps_clip``."""
    dual_clip: float | None = None
    """Dual clip c > 1: for negative advantages the loss term is at most ``-c·A`` (ppo, gspo); null: off."""
    behav_weight: bool = True
    """Multiply each token's term by the behaviour weight w = π_prox/π_behav (decoupled PPO); false:
    leave it out, a clip around π_prox only (AReaL's ``rejection_sampling=None``; needs behav_cap=null)."""
    behav_cap: float | None = 5.0
    """Cap C on the behaviour weight w = π_prox/π_behav (null: uncapped, the AReaL paper's setting)."""
    behav_cap_mode: BehavCapMode = "mask"
    """mask (drop what is over the cap: masked importance sampling) | clamp (min(w, C): truncated
    importance sampling)."""
    behav_cap_level: BehavCapLevel = "token"
    """token (each token's w) | sequence (the geometric mean of w over a sequence's loss tokens:
    sequence-level masked / truncated importance sampling)."""
    max_version_gap: int | None = None
    """Token-level masking by version gap: tokens sampled more than this many versions before the
    trainer's current version are dropped from the loss (kept in its denominator); null: off."""
    m2_threshold: float | None = None
    """M2PO's second-moment trust region τ: per PPO mini-batch, the tokens with the largest
    (log π_prox/π_behav)² are dropped until the mean of that square over the rest is <= τ (0.04 is
    the default of the implementations consulted; docs/algorithms.md); null: off. Needs
    prox_mode=recompute."""
    kl_coef: float = 0.0
    """Weight of a KL penalty to the reference policy (the initial weights, frozen), added to the
    loss with the same aggregation; 0: off (it costs one more forward pass per micro-batch and a
    copy of the weights)."""
    kl_estimator: KLEstimator = "k3"
    """k1 | k2 | k3: Schulman's estimators of KL(π_θ ‖ π_ref) per token (``algo.logprobs.kl_penalty``)."""
    overlong_buffer: int = 0
    """DAPO's soft overlong penalty: responses longer than ``rollout.max_new_tokens - overlong_buffer``
    get a reward penalty growing linearly to ``-overlong_penalty`` at max_new_tokens (added to the
    reward before the advantages; the ledger keeps the verifier's reward); 0: off."""
    overlong_penalty: float = 1.0
    """The penalty at ``rollout.max_new_tokens`` (see ``overlong_buffer``)."""
    aggregation: Aggregation = "token_mean"
    """token_mean | seq_mean_token_mean | seq_mean_token_sum."""
    filter_equal_rewards: bool = True
    """Dynamic sampling: drop groups whose rewards are all equal (no learning signal)."""


@dataclass(frozen=True)
class TrainerConfig:
    """The optimizer, micro-batching, precision, weight export and LoRA of the trainer."""

    lr: float = 1e-4
    """Adam step size. Measured on the default task: 1e-4 learns (sampled held-out accuracy 0.37 -> 0.73 in 80
    steps); 3e-4 rises then collapses; 1e-3 collapses within 10 steps."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.99)
    """Adam's (β1, β2)."""
    grad_clip: float = 1.0
    """Largest global gradient norm; larger gradients are scaled down to it."""
    warmup_steps: int = 10
    """Training steps of the linear LR warm-up (then ``lr_schedule``)."""
    ppo_minibatches: int = 1
    """Optimizer updates per training step, each over an equal share of the step's samples."""
    max_tokens_per_micro_batch: int = 1024
    """Token budget of one packed micro-batch (a longer sequence gets a micro-batch of its own); the
    warm start uses it too."""
    seed: int = 0
    """Seed of the LoRA adapters' initialisation."""
    micro_batching: MicroBatching = "packed"
    """packed (padding-free streams under the token budget, varlen attention) | padded (fixed-size
    micro-batches of ``padded_micro_batch_size`` right-padded sequences in batch order: the
    baseline) | padded_grouped (the same, over the batch sorted by length, so that sequences of
    similar length pad together: what a length-grouped sampler such as HF's ``group_by_length``
    gives)."""
    padded_micro_batch_size: int = 8
    """Sequences per micro-batch when ``micro_batching`` is padded or padded_grouped."""
    balance: BalanceMethod = "ffd"
    """How sequences are binned into micro-batches and spread over data-parallel ranks:
    ffd (first-fit-decreasing into the least-loaded fitting bin) | kk (Karmarkar-Karp)."""
    lr_schedule: LRSchedule = "constant"
    """LR after the linear warm-up: constant | linear | cosine (decay to ``min_lr_ratio * lr``)."""
    decay_steps: int = 0
    """Training steps over which the LR decays (warm-up included); 0: the run's total steps."""
    min_lr_ratio: float = 0.0
    """Final LR of a decaying schedule, as a fraction of ``lr``."""
    precision: Precision = "auto"
    """auto (bf16 mixed precision on CUDA, fp32 on CPU) | fp32 | bf16."""
    activation_checkpointing: bool | None = None
    """Recompute layer activations in backward; None: on for CUDA, off for CPU."""
    weight_transport: WeightTransport = "tensors"
    """How ``export_weights`` hands weights to engines: tensors (in-process) | safetensors (a directory)."""
    weight_export_dir: str | None = None
    """Where safetensors exports are written (one sub-directory per version); None: a temp directory."""
    broadcast_bucket_mb: int = 1024
    """Bucket size of the ``torch.distributed`` weight broadcast to engines."""
    lora_rank: int = 0
    """LoRA rank (through ``peft``); 0 trains all weights. Engines always get merged weights."""
    lora_alpha: float = 16.0
    """LoRA scaling numerator (the update is ``lora_alpha / lora_rank * B @ A``)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA input path (0 keeps training deterministic)."""
    lora_target_modules: str = "all-linear"
    """Comma-separated module names to adapt, or all-linear."""
    dist_timeout_s: int = 7200
    """Timeout of the trainer's process group (data-parallel ranks wait this long for the leader)."""
