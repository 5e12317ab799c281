"""The config tree: one frozen, typed dataclass per section and ``Config``, their root.

Every field has a default, so ``Config()`` is the embedded default run (tiny model, synthetic
arithmetic task, asynchronous RL on CPU), and every field is documented under its declaration
(``tests/test_config_fields.py`` holds that; ``docs/config.md`` is generated from these docstrings). A
choice field is typed with its ``Literal`` alias from ``asyncrl.choices`` (the functions that take the
choice use the same alias). The ``agent`` section is in ``config.agent``, ``algo`` and ``trainer`` in
``config.learn``. No torch; nothing of the project but ``choices`` and those two modules.

Batch-size semantics, stated once (a known confusion in peers): one training step consumes
``controller.batch_size`` prompt *groups*, each of ``rollout.group_size`` samples, so
``batch_size * group_size`` sequences; ``trainer.ppo_minibatches`` optimizer updates are made
from them, each over packed micro-batches of at most ``trainer.max_tokens_per_micro_batch``
tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncrl.choices import (
    ArithmeticForm,
    DType,
    EngineMode,
    HighWaterUnit,
    InterruptMode,
    LaunchKind,
    PlacementStrategy,
    RayWeightSync,
    RolloutBackend,
    StragglerPolicy,
    TaskName,
    WeightSyncMode,
)
from asyncrl.config.agent import AgentConfig
from asyncrl.config.learn import AlgoConfig, TrainerConfig


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
    jsonl (task.path: rows with `prompt`, `answer`, optional `id`) | reasoning_gym (task.datasets, generated
    with task.seed) | verifiers (task.datasets: a verifiers taskset id, played by agent.env=verifiers). Set
    task.verifier to match (math for gsm8k, code for humaneval, reasoning_gym for reasoning_gym)."""
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
    """Which verifier scores a response (see reward.service): arithmetic | math | code | custom:mod:fn |
    reasoning_gym (the dataset's own ``score_answer``; only with task.name=reasoning_gym)."""
    datasets: str | None = None
    """task.name=reasoning_gym: the reasoning-gym dataset(s), comma-separated (e.g. ``basic_arithmetic`` or
    ``chain_sum,basic_arithmetic``: drawn with equal weights), each at its default configuration or with
    reasoning-gym's config options after its name (``chain_sum:max_terms=3:max_digits=2``);
    ``train_size`` + ``eval_size`` entries generated with task.seed (data.reasoning_gym). task.name=verifiers:
    the verifiers taskset id (an installed module exporting one ``vf.Taskset``; data.verifiers)."""
    calculator_max_digits: int = 0
    """Calculator: most decimal digits of any operand (0: the built-in ranges, 2-7 digits by problem
    kind; 3 gives products like 483*57, still beyond a tiny model's mental arithmetic, with shorter
    operands and results to copy). At least 2 when set; a new value is a new problem set."""


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
    tool_call_fraction: float = 1.0
    """``task.name=calculator``: the share of training problems whose demonstration calls the tool, in
    [0, 1]; the rest answer directly (``#answer`` as the first assistant turn, no call), chosen per problem
    by a hash of its question (``data.calculator.demonstrates_call``). 1.0: every demonstration calls it."""
    second_stage_steps: int = 0
    """``task.name=calculator``: steps of a second warm-start stage, continuing the first on the same training
    problems with ``sft.second_stage_tool_call_fraction`` of them calling the tool and the rest answering
    directly, at ``sft.second_stage_lr`` after ``sft.second_stage_warmup_steps`` of warm-up. With a first stage
    that calls on every problem (it learns to copy the expression into the call) and a fraction below 1, the
    policy can use the tool but seldom reaches for it: the start from which RL teaches it to (docs/agent.md
    "Adoption"). 0: one stage."""
    second_stage_tool_call_fraction: float = 0.3
    """The second stage's share of demonstrations that call the tool, in [0, 1] (read when
    ``sft.second_stage_steps`` > 0)."""
    second_stage_lr: float = 1e-3
    """The second stage's peak AdamW step size (linear warm-up, then linear decay to 5% of it)."""
    second_stage_warmup_steps: int = 10
    """The second stage's warm-up steps."""
    restart_check_step: int = 0
    """After this many steps of the warm start's (first) stage, a smoothed loss above ``sft.restart_loss_above``
    means the stage has not taken (the calculator's: the policy has not learned to copy; when it does depends on
    the example order): it is abandoned, the tiny policy built again (the same initial weights: the build's seed
    is fixed) and the stage run again with the next example order (``sft.seed`` + 1000 x the restart), at most
    ``sft.max_restarts`` times; the last attempt runs to the end whatever its loss. 0: never (else below
    ``sft.steps``)."""
    restart_loss_above: float = 0.5
    """The smoothed loss above which ``sft.restart_check_step`` abandons the stage (read when it is > 0)."""
    max_restarts: int = 2
    """How many times ``sft.restart_check_step`` may start the stage again (>= 1; read when the check is on)."""
    stop_below_loss: float = 0.0
    """End the warm start's (first) stage at the first step after the warm-up whose smoothed loss is below this:
    every seed then starts RL from a policy at the same loss, where a fixed step count leaves some seeds far past
    a sudden drop in the loss (the calculator's: learning to copy numbers into the call) and others before it.
    0: never (the stage runs its ``sft.steps``)."""
    # The shape of the tiny model the warm start builds (``models.TinyModelSpec`` takes its defaults from
    # here: 800,384 parameters). Read only when the tiny model is built (``model.path`` null); the warm-start
    # cache key hashes the shape, and a config at these defaults keeps the key it had before they existed.
    hidden_size: int = 128
    """Tiny model: hidden size (a multiple of ``sft.num_heads`` giving an even head size, for RoPE)."""
    num_layers: int = 4
    """Tiny model: decoder layers."""
    num_heads: int = 4
    """Tiny model: attention heads (a multiple of ``sft.num_kv_heads``)."""
    num_kv_heads: int = 2
    """Tiny model: key/value heads (grouped-query attention; equal to ``sft.num_heads``: none)."""
    intermediate_size: int = 384
    """Tiny model: hidden size of the SwiGLU MLP."""


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
    backend: RolloutBackend = "local"
    """local (the project's engine) | vllm (vLLM's AsyncLLM: ``make vllm-env``, then run from ``.venv-vllm``; in
    the launcher's process, or with launch.kind=ray one per engine actor, rollout.num_engines replicas;
    top_p=1, top_k=0; ``rollout.vllm_engine``) | sglang (running SGLang
    servers at ``rollout.sglang_urls``; weights through trainer.weight_export_dir, which they must read;
    ``rollout.sglang_engine``). The same contract every way: token ids in and out, behaviour log-probs of the
    tempered distribution, per-token versions stamped by the engine, in-flight updates in ``interrupt_mode``."""
    sglang_urls: str = ""
    """backend=sglang: the SGLang servers (``python -m sglang.launch_server``), comma-separated
    ``http://host:port``; requests go to the one with the fewest tokens in flight."""
    tensor_parallel_size: int = 1
    """backend=vllm: the GPUs each engine shards its model across (vLLM's ``tensor_parallel_size``); 1 with
    backend=local; an SGLang server sets its own (``--tp``)."""
    gpu_memory_fraction: float | None = None
    """backend=vllm: the share of each GPU's total memory vLLM may take, in (0, 1] (its
    ``gpu_memory_utilization``); null: vLLM's default, 0.9, which leaves no room for a trainer on the same GPU."""
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
    do not keep the engine half empty: for generation-bound, long-tailed workloads (``python -m
    benchmarks async --workload long``). Per-sample completion comes from ``LocalEngine``; with other engines a
    group's samples are counted done when the engine returns the group, as with ``groups``."""
    stragglers: StragglerPolicy = "drop"
    """drop | wait: what happens to a group that may finish after the last step allowed to train it
    (admitted at version v, bound η: step v + η). ``drop``: the trainer goes on and the group is dropped as
    stale if it finishes too late (the ledger's ``stale``). ``wait``: batches take the groups due soonest,
    and a step waits for running groups while that order could not otherwise train every group in time
    (``controller.staleness.must_wait_for_stragglers``), so none is dropped for staleness and every trained
    sample is still within η. On long-tailed workloads ``drop`` trains the long problems less (their groups
    finish past the bound); ``wait`` trains every admitted prompt at the cost of the trainer waiting for
    them. Keep ``episode_timeout_s`` > 0 with it (a hung request holds the trainer until it times out).
    docs/controller.md §1, Stragglers."""
    adaptive: bool = False
    """Set the mark and η_t <= max_staleness online from measurements (docs/controller.md §1.1; not with fixed_lag)."""
    total_steps: int = 120
    """Training steps of the run (each publishes one policy version)."""
    max_rl_time_s: float = 0.0
    """A wall-time budget: no training step starts once the run's RL time (across resumes) reached
    it, and the run ends as it does after ``total_steps`` (final snapshot, checkpoint, evaluation);
    the step under way when the budget passes finishes; ``summary.json`` says ``ended_by``. 0: none
    (``total_steps`` alone ends the run). Held-out evaluations during RL (``eval_every``) count against
    it. A decaying LR schedule still decays over ``trainer.decay_steps`` or ``total_steps``, so set
    ``decay_steps`` with a budget. Resuming a run its budget ended needs a larger budget.
    ``python -m benchmarks headline --time-budget-s`` gives every arm the same budget."""
    eval_every: int = 0
    """Held-out accuracy every N steps during RL (``eval_accuracy`` etc. in that step's line of
    metrics.jsonl; the trainer waits meanwhile, the time counts in RL wall time); 0: only before
    and after."""
    snapshot_every_s: float = 0.0
    """Save the published policy as a Hugging Face checkpoint (``RUN_DIR/snapshots/v<version>``,
    listed with its RL time in ``snapshots.jsonl``) at the start, whenever this many seconds of RL
    time passed since the last one, and at the end; 0: off. ``python -m benchmarks headline`` evaluates
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
    finished, then update: the no-interruption baseline of ``python -m benchmarks interrupt``)."""
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
