"""The config tree: typed dataclasses, YAML loading, ``--set key=value`` overrides, validation.

Every field has a default, so ``Config()`` is the embedded default run (tiny model, synthetic
arithmetic task, asynchronous RL on CPU). A YAML file overrides any subset; ``--set a.b=v``
overrides single fields (the value is parsed as YAML: ``4``, ``0.5``, ``true``, ``null``,
``[1, 2]``). Unknown keys and values of the wrong type are errors that name the key and the
valid choices (the generic parsing is ``config_parse``, the checks ``config_checks``). A choice
field is typed with its ``Literal`` alias from ``asyncrl.choices`` (the functions that take the
choice use the same alias) and checked against it. Every field is documented under its
declaration (``tests/test_config_fields.py`` holds that). The tree is frozen: a changed config
is a new one (``with_values(cfg, {"model.path": p})``, checked and validated like an override,
or ``dataclasses.replace``). No torch; no sibling but ``config_parse``, ``config_checks``,
``config_agent`` (the ``agent`` section) and ``choices``.

Batch-size semantics, stated once (a known confusion in peers): one training step consumes
``controller.batch_size`` prompt *groups*, each of ``rollout.group_size`` samples, so
``batch_size * group_size`` sequences; ``trainer.ppo_minibatches`` optimizer updates are made
from them, each over packed micro-batches of at most ``trainer.max_tokens_per_micro_batch``
tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from asyncrl.choices import (
    AdvantageEstimator,
    Aggregation,
    ArithmeticForm,
    BalanceMethod,
    BehavCapLevel,
    BehavCapMode,
    DType,
    EngineMode,
    HighWaterUnit,
    InterruptMode,
    KLEstimator,
    LaunchKind,
    LossType,
    LRSchedule,
    MicroBatching,
    PlacementStrategy,
    Precision,
    ProxMode,
    RayWeightSync,
    TaskName,
    WeightSyncMode,
    WeightTransport,
)
from asyncrl.config_agent import AgentConfig
from asyncrl.config_checks import validate
from asyncrl.config_parse import ConfigError, apply_mapping, nest, parse_override, read_yaml

__all__ = ["Config", "ConfigError", "dump_yaml", "load_config", "parse_override", "to_dict", "validate", "with_values"]


@dataclass(frozen=True)
class ModelConfig:
    """The policy: which weights, in which dtype, on which device."""

    path: str | None = None
    """A local Hugging Face causal-LM directory. None: the tiny default, built and warm-started
    (``asyncrl sft``) into ``sft.cache_dir`` on first use and reused afterwards."""
    dtype: DType = "float32"
    """float32 | bfloat16 | float16 (CPU: keep float32)."""
    device: str = "cpu"
    """cpu | cuda | cuda:N."""


@dataclass(frozen=True)
class TaskConfig:
    """The prompts (training and held-out) and the verifier that scores their answers."""

    name: TaskName = "arithmetic"
    """arithmetic (synthetic, embedded default) | gsm8k | humaneval (../shared/data or task.path) |
    jsonl (task.path: rows with `prompt`, `answer`, optional `id`). Set task.verifier to match
    (math for gsm8k, code for humaneval)."""
    seed: int = 1234
    """Seed of the synthetic generator and of the train/held-out split."""
    train_size: int = 20000
    """Training prompts: generated for arithmetic, the first ones after the held-out split for datasets."""
    eval_size: int = 256
    """Held-out prompts used for accuracy_before / accuracy_after."""
    max_terms: int = 8
    """Synthetic arithmetic: most operands in one problem (the long tail of response lengths)."""
    length_tail: float = 0.5
    """Synthetic arithmetic: P(one more operand). 0.5 gives many short and a few long problems."""
    max_operand: int = 9
    """Synthetic arithmetic: largest operand (running totals stay in [0, 10 * max_operand])."""
    form: ArithmeticForm = "chain"
    """Synthetic arithmetic: chain (additions and subtractions, the default) | repeat (a product
    modulo 10 worked out as repeated addition: long chains a tiny model can keep right)."""
    path: str | None = None
    """Dataset file for gsm8k/jsonl tasks (default: ../shared/data for gsm8k)."""
    verifier: str = "arithmetic"
    """Which verifier scores a response (see reward.service): arithmetic | math | code | custom:mod:fn."""


@dataclass(frozen=True)
class RewardConfig:
    """The reward service: worker processes, timeouts and retries of verification."""

    num_workers: int = 2
    """Reward-service worker processes (verifiers other than the inline arithmetic one); under
    launch.kind=ray, K reward-worker actors that score every verifier, arithmetic included."""
    timeout_s: float = 10.0
    """Per-item verification timeout; a timeout is a failure (sample filtered), never a 0."""
    max_retries: int = 2
    """Retries for infrastructure failures only (a dead worker), never for a wrong answer."""


@dataclass(frozen=True)
class SFTConfig:
    """The supervised warm start of the tiny default policy (``asyncrl sft``; used when ``model.path`` is None)."""

    steps: int = 400
    """Optimizer steps of the warm start."""
    batch_size: int = 64
    """Demonstrations per step."""
    lr: float = 3e-3
    """AdamW peak step size (linear warm-up, then linear decay to 5% of it)."""
    warmup_steps: int = 30
    """Steps of the linear LR warm-up."""
    seed: int = 0
    """Seed of the warm start's example order and of torch."""
    teacher_slip_rate: float = 0.6
    """Synthetic task: fraction of demonstrations whose final answer slips to the running total
    before the last operation (a flawed teacher; RL with the verifier has to unlearn the slip).
    0 gives clean demonstrations."""
    cache_dir: str = ".cache/asyncrl"
    """Where the built tiny model and its warm start are cached (keyed by the SFT settings)."""


@dataclass(frozen=True)
class RolloutConfig:
    """Generation: the samples per prompt, how they are sampled, and the engines that decode them."""

    group_size: int = 8
    """G: samples per prompt."""
    temperature: float = 1.0
    """Sampling temperature (> 0; the behaviour log-probs are of the tempered distribution). For argmax
    decoding in evaluation use ``eval.greedy``."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens with this much probability, in (0, 1]; 1: off."""
    top_k: int = 0
    """Keep the k most likely tokens; 0: off."""
    max_new_tokens: int = 160
    """Most tokens generated per sample (the stop token counts); longer samples end with ``length``."""
    max_prompt_len: int = 1024
    """Longest prompt (tokens) a run admits; longer dataset prompts are dropped with a warning.
    The engine's KV cache holds ``max_prompt_len + max_new_tokens`` tokens per slot."""
    max_slots: int = 128
    """Engine concurrency (decode slots)."""
    interrupt_mode: InterruptMode = "abort"
    """abort (AReaL: stop, re-prefill under new weights) | keep (swap weights, keep KV cache)."""
    prefix_reuse: bool = False
    """Keep a finished sample's KV in its slot (until the slot is needed) so that a prompt extending that
    sequence, the next turn of a multi-turn episode, prefills only its new tokens (LocalEngine; dropped
    at every weight update; docs/engine.md "Prefix reuse across turns")."""
    num_engines: int = 1
    """N: engine instances (launch.kind=ray; the local launcher runs one). Requests go to the engine
    with the fewest tokens in flight."""
    workflow: str = "single_turn"
    """single_turn | agent (multi-turn with tools, ``agent.*``) | openai_agent (``agent.entrypoint``, an agent
    written against the ``openai`` client, through the door) | pkg.module:function (``run_episode``'s signature)."""


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
    off-policy correction at all: the "no correction" arm of ``asyncrl bench ablation``)."""
    prox_mode: ProxMode = "recompute"
    """recompute (extra forward pass with pre-update weights: decoupled PPO) | loglinear
    (approximate from stored versions) | behav (naive PPO: the behaviour policy is the clip centre)."""
    eps_clip: float = 0.2
    """ε: the ratio is clipped to [1 - ε, 1 + ε_high] (GSPO wants a much smaller one, ~3e-4)."""
    eps_clip_high: float | None = None
    """ε_high, the upper clip bound's (DAPO's clip-higher); null: ``eps_clip``."""
    dual_clip: float | None = None
    """Dual clip c > 1: for negative advantages the loss term is at most ``-c·A`` (ppo, gspo); null: off."""
    behav_cap: float | None = 5.0
    """Cap C on the behaviour weight w = π_prox/π_behav (null: uncapped)."""
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


@dataclass(frozen=True)
class ControllerConfig:
    """The loop: batch size, staleness bound, admission, checkpoints, retries and weight sync."""

    batch_size: int = 16
    """Prompt groups per training step."""
    max_staleness: int = 4
    """η: a sample trained at step i has min_version >= i - η. 0 is synchronous training."""
    fixed_lag: int | None = None
    """Controlled staleness k: training step i is trained on samples generated entirely by version
    max(0, i - k), independent of machine speed (``controller.fixed_lag``). Admission is synchronous
    (as max_staleness = 0) and the engine receives each version's weights k steps late (a ring of
    the last k exports); k = 0 is ordinary synchronous training. Needs max_staleness >= k (the bound
    the batcher still checks), trainer.weight_transport=tensors and the local launcher without
    engine_urls and controller.eval_every=0 (held-out accuracy before and after only); not resumable.
    null: off."""
    max_concurrent: int = 64
    """Cap on prompt groups in flight (admitted, not yet in the buffer)."""
    high_water_batches: int = 2
    """High-water mark of admission, in batches: admit only while buffered + running groups
    < high_water_batches * batch_size (the staleness rule still applies); 0: off, the engine may
    fill the whole staleness budget ((max_staleness + 1) * batch_size groups ahead). Keeps the
    engine from running ahead of a trainer-bound loop (CPU taken from the trainer, staler samples,
    batches generated and never trained)."""
    high_water_unit: HighWaterUnit = "groups"
    """groups | samples: what a running group weighs under the high-water mark. ``groups``: all of it
    until its last sample ends. ``samples``: only its samples still generating (the mark is
    high_water_batches * batch_size * group_size samples), so groups that wait for one long sample
    do not keep the engine half empty: for generation-bound, long-tailed workloads (``asyncrl bench
    async --workload long``). Per-sample completion comes from ``LocalEngine``; with other engines a
    group's samples are counted done when the engine returns the group, as with ``groups``."""
    adaptive: bool = False
    """Set the mark and η_t <= max_staleness online from measurements (docs/controller.md §1.1; not with fixed_lag)."""
    total_steps: int = 120
    """Training steps of the run (each publishes one policy version)."""
    eval_every: int = 0
    """Held-out accuracy every N steps during RL (``eval_accuracy`` etc. in that step's line of
    metrics.jsonl; the trainer waits meanwhile, the time counts in RL wall time); 0: only before
    and after."""
    snapshot_every_s: float = 0.0
    """Save the published policy as a Hugging Face checkpoint (``RUN_DIR/snapshots/v<version>``,
    listed with its RL time in ``snapshots.jsonl``) at the start, whenever this many seconds of RL
    time passed since the last one, and at the end; 0: off. ``asyncrl bench headline`` evaluates
    them afterwards (accuracy against wall time; a snapshot costs the run only its save, milliseconds
    for the tiny model)."""
    checkpoint_every: int = 10
    """Save a resumable checkpoint (trainer state, data position, ledger offsets, staleness
    counters) every N steps into ``RUN_DIR/checkpoints/``; 0: only at the end and on SIGINT/SIGTERM."""
    keep_checkpoints: int = 2
    """Resumable checkpoints kept (the newest ones); at least 2, so that a resume that finds the
    newest one damaged (``controller.resume.resume_checkpoint``) has a previous one to fall back to."""
    episode_retries: int = 2
    """Retries of an episode whose engine request failed or timed out; after them the prompt is
    dropped (ledger: ``engine_failure``) and its budget given back."""
    episode_timeout_s: float = 600.0
    """Wall-clock limit of one episode attempt (generation + scoring); 0: none."""
    max_engine_failures: int = 8
    """Consecutive episodes dropped after all retries that stop the run with an error; also, counted
    apart, consecutive groups filtered because their rewards could not be computed (a broken verifier:
    ``controller.scoring.ScoringFailed``)."""
    weight_sync: WeightSyncMode = "inflight"
    """inflight (new weights reach the engine between two decode steps, in
    ``rollout.interrupt_mode``) | drain (stop admitting and wait until every running episode
    finished, then update: the no-interruption baseline of ``asyncrl bench interrupt``)."""
    trainer_process: bool = True
    """Local launcher: run the trainer in its own process (``controller.trainer_process``); as a
    thread of the engine's process the two take turns on the GIL (measured: both ~2x slower)."""


@dataclass(frozen=True)
class LaunchConfig:
    """Where the stages run (``docs/ray.md``). The controller is the same for every launcher."""

    kind: LaunchKind = "local"
    """local (one machine: engine thread + trainer process) | ray (engines, trainer ranks and reward
    workers as Ray actors; ``pip install asyncrl[ray]``). ``asyncrl train --launcher ray`` sets it."""
    ray_address: str | None = None
    """None: start a Ray instance on this machine; "auto": join the running cluster (``ray start
    --head`` first); or ``host:port`` of its head."""
    ray_num_cpus: int = 0
    """Logical CPUs of a Ray instance started here (0: this machine's cores, or the CPUs the run
    requests when that is more; Ray's CPUs are scheduling units, so oversubscribing is allowed)."""
    trainer_ranks: int = 1
    """M: trainer processes, one FSDP2 process group (gloo on CPU, NCCL when gpus_per_trainer > 0)."""
    cpus_per_engine: float = 1.0
    """CPUs requested by each of the ``rollout.num_engines`` engine actors (Ray's logical units; fractions
    allowed, as for every resource request below)."""
    gpus_per_engine: float = 0.0
    """GPUs requested by each engine actor."""
    cpus_per_trainer: float = 1.0
    """CPUs requested by each of the ``launch.trainer_ranks`` trainer actors."""
    gpus_per_trainer: float = 0.0
    """GPUs requested by each trainer actor (> 0: NCCL instead of gloo)."""
    cpus_per_reward_worker: float = 1.0
    """CPUs requested by each of the ``reward.num_workers`` reward-worker actors."""
    placement_strategy: PlacementStrategy = "PACK"
    """Ray placement group strategy of all actors: PACK | SPREAD | STRICT_PACK | STRICT_SPREAD."""
    weight_sync: RayWeightSync = "object_store"
    """Trainer -> engines: object_store (rank 0 puts byte buckets in Ray's object store, every engine
    reads them) | disk (a safetensors directory under trainer.weight_export_dir: a shared filesystem)."""
    engine_mode: EngineMode = "actor"
    """actor (engines are Ray actors called directly) | server (each engine actor serves the
    SGLang-native HTTP protocol and the controller reaches it with RemoteEngine; weight_sync=disk)."""
    engine_urls: str = ""
    """Comma-separated URLs of running engine servers (``asyncrl serve engine`` or SGLang) to use
    instead of starting engines (any launcher; weights go through disk)."""
    max_engine_restarts: int = 3
    """An engine that dies is restarted (its requests re-run elsewhere) at most this many times."""
    startup_timeout_s: float = 300.0
    """How long to wait for the placement group and the actors to come up."""


@dataclass(frozen=True)
class EvalConfig:
    """Held-out accuracy before, during and after RL."""

    greedy: bool = False
    """How ``accuracy_before``/``accuracy_after`` decode: False samples at the rollout temperature
    (the policy's own pass@1, averaged over ``samples_per_prompt`` samples); True is argmax."""
    samples_per_prompt: int = 4
    """Samples per held-out prompt for the sampled accuracy (ignored when greedy)."""
    report_greedy: bool = True
    """Also measure greedy accuracy (``accuracy_greedy_before``/``_after`` in the summary)."""
    max_new_tokens: int = 160
    """Most tokens generated per held-out answer."""


@dataclass(frozen=True)
class RunConfig:
    """The run directory, seed, threads and progress display."""

    run_dir: str | None = None
    """Output directory; None -> runs/<timestamp>."""
    seed: int = 0
    """Seed of Python, NumPy and torch in every process of the run, and of the training prompts' order."""
    torch_threads: int = 1
    """Intra-op threads per process (0: torch's default). 1 is right for the local launcher: the
    engine thread and the trainer thread each run on their own core, and OpenMP teams of several
    threads from two Python threads oversubscribe the cores (measured 6x slower on 2 cores)."""
    progress: bool = True
    """Show progress bars (warm start, RL steps)."""


@dataclass(frozen=True)
class Config:
    """The whole config tree: one section per stage (see the module docstring)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy's weights, dtype and device."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """Prompts and verifier."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """The reward service."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """The tiny default policy's warm start."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation and engines."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """Multi-turn episodes with tools (``rollout.workflow=agent``)."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Advantages and losses."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """The trainer."""
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    """The asynchronous loop."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation."""
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    """Where the stages run."""
    run: RunConfig = field(default_factory=RunConfig)
    """The run directory and process settings."""


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain nested dicts (for YAML/JSON dumps)."""
    return dataclasses.asdict(cfg)


def dump_yaml(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML (tuples as lists)."""
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def load_config(
    path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (), *, base: str | Path | None = None
) -> Config:
    """Defaults, then the YAML file ``base`` (if any: the saved ``config.yaml`` of a run that is
    resumed), then the YAML file ``path`` on top of it (if any: only the keys it holds change),
    then each ``key=value`` override; validated once, at the end."""
    cfg = Config()
    for layer in (base, path):
        if layer is not None:
            cfg = apply_mapping(cfg, read_yaml(layer), "")
    for text in overrides:
        key, value = parse_override(text)
        cfg = apply_mapping(cfg, nest(key, value), "")
    return validate(cfg)


def with_values(cfg: Config, values: Mapping[str, Any]) -> Config:
    """A copy of ``cfg`` with the dotted keys of ``values`` set (``{"model.path": "ckpt"}``), each value
    checked like a ``--set`` override and the result validated; ``cfg`` itself is frozen and unchanged."""
    for key, value in values.items():
        cfg = apply_mapping(cfg, nest(key, value), "")
    return validate(cfg)
