"""Records that cross stage boundaries (DESIGN §3).

Small frozen dataclasses with plain-Python fields only: this module imports no torch and no
sibling, so every stage (data, rollout, reward, trainer, controller) can share it.

Log-prob naming is explicit everywhere (a known source of confusion in peers):
- *behaviour* log-probs (``behav_logprobs``) are the engine's log-probs of the sampled tokens
  under the weights that sampled them;
- *proximal* log-probs are recomputed by the trainer with the weights at the start of a step;
- *current* log-probs come from the weights being optimised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class Prompt:
    """One task instance handed to a workflow."""

    prompt_id: str
    """Stable id, unique within a dataset split (used by the ledger and resume)."""
    token_ids: tuple[int, ...]
    """The rendered prompt, already tokenised (never re-tokenised later)."""
    answer: str = ""
    """Reference answer for the verifier (e.g. the final number)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Anything else the verifier or the logs need (difficulty, dataset row, ...)."""


KIND_KEY = "problem_kind"
"""The ``Prompt.meta`` key of a prompt's problem kind (set by the calculator task; a string): held-out
evaluation reports accuracy per kind when present. Reserved, so a dataset row's own fields never set it."""


@dataclass(frozen=True)
class Completion:
    """One sampled continuation of a prompt, as returned by an engine."""

    prompt_ids: tuple[int, ...]
    """The prompt token ids the engine conditioned on (the original prompt, not a resubmission)."""
    output_ids: tuple[int, ...]
    """Generated token ids, in order (EOS included when it was sampled)."""
    behav_logprobs: tuple[float, ...]
    """One behaviour log-prob per output token: log softmax(logits / temperature) of the sampled
    token, before any top-p/top-k truncation (the distribution the trainer recomputes)."""
    versions: tuple[int, ...]
    """Policy version per output token, stamped by the engine that produced it."""
    finish_reason: FinishReason
    """``stop`` (a stop token), ``length`` (budget used up) or ``abort`` (interrupted)."""
    num_interruptions: int = 0
    """How many weight updates interrupted this completion while it was being generated."""
    loss_mask: tuple[int, ...] = ()
    """Per output token: 1 where the model sampled it, 0 where the environment put it there (a
    multi-turn trajectory flattened by ``Trajectory.to_completion``: tool results, user turns,
    template glue; their ``behav_logprobs`` are 0.0 and ``versions`` -1). Empty (the single-turn
    default) means every output token is a model token."""

    def __post_init__(self) -> None:
        n = len(self.output_ids)
        if len(self.behav_logprobs) != n or len(self.versions) != n:
            raise ValueError(
                f"Completion: output_ids ({n}), behav_logprobs ({len(self.behav_logprobs)}) and "
                f"versions ({len(self.versions)}) must have the same length"
            )
        if self.loss_mask and (len(self.loss_mask) != n or not set(self.loss_mask) <= {0, 1}):
            raise ValueError(f"Completion: loss_mask must be empty or {n} entries of 0/1")

    @property
    def output_mask(self) -> tuple[int, ...]:
        """``loss_mask`` with the single-turn default spelled out (all ones)."""
        return self.loss_mask or (1,) * len(self.output_ids)

    @property
    def model_versions(self) -> tuple[int, ...]:
        """The versions of the model tokens (environment tokens carry none)."""
        if not self.loss_mask:
            return self.versions
        return tuple(v for v, m in zip(self.versions, self.loss_mask, strict=True) if m)

    @property
    def min_version(self) -> int:
        """Oldest policy version behind any model token (-1 when there is none)."""
        versions = self.model_versions
        return min(versions) if versions else -1

    @property
    def max_version(self) -> int:
        """Newest policy version behind any model token (-1 when there is none)."""
        versions = self.model_versions
        return max(versions) if versions else -1


EnvKind = Literal["tool", "user", "error"]
"""What an environment segment carries: tool results, a user (observation) turn, or the error
message answering a malformed tool call; each with the chat template's glue around it."""

EpisodeEnd = Literal["answer", "env_done", "max_turns", "max_tokens", "length"]
"""Why an episode ended: the model answered (a turn without a tool call), the environment said
done, the turn budget or the token budget ran out, or a model turn used up its token budget."""


@dataclass(frozen=True)
class ModelSegment:
    """One model turn's tokens exactly as the engine sampled them (across any interruptions)."""

    token_ids: tuple[int, ...]
    behav_logprobs: tuple[float, ...]
    """One behaviour log-prob per token (see ``Completion.behav_logprobs``)."""
    versions: tuple[int, ...]
    """Policy version per token, stamped by the engine."""
    finish_reason: FinishReason
    """``stop`` (end of turn, or a tool-call close tag) or ``length`` (the turn's budget)."""
    num_interruptions: int = 0

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.behav_logprobs) != n or len(self.versions) != n:
            raise ValueError("ModelSegment: token_ids, behav_logprobs and versions must have the same length")


@dataclass(frozen=True)
class EnvSegment:
    """Tokens the environment put into the conversation (never trained on)."""

    token_ids: tuple[int, ...]
    """The chat template's rendering of the environment's messages, glue included (the end of the
    model's turn when the model did not sample it, the next turn's header, the generation prompt)."""
    kind: EnvKind


Segment = ModelSegment | EnvSegment


@dataclass(frozen=True)
class TurnRecord:
    """Metadata of one model turn and the environment step that answered it (ledger, metrics)."""

    model_tokens: int
    env_tokens: int
    """Tokens of the environment segment that followed (0 when the episode ended here)."""
    min_version: int
    max_version: int
    """Oldest / newest version behind the turn's tokens (-1 for an empty turn)."""
    finish_reason: FinishReason
    num_interruptions: int = 0
    tool_calls: tuple[str, ...] = ()
    """Names of the well-formed tool calls of the turn, in order."""
    tool_errors: int = 0
    """Well-formed calls whose tool failed (unknown tool, bad arguments, error, timeout)."""
    malformed: int = 0
    """Calls that could not be parsed (answered with an error message the model sees)."""
    tool_hits: int | None = None
    """Successful calls whose result is what the task needed (the calculator: the reference answer);
    None when the environment cannot tell."""
    tool_latency_s: float = 0.0
    """Wall time of the environment step."""
    tool_started_at: float | None = None
    """Wall-clock time (``time.time()``) at which the environment step began (it lasted ``tool_latency_s``);
    None when no step answered the turn. The ledger puts the waits of turns with tool calls on the run's
    RL clock (``controller.rundir.episode_entry``)."""


@dataclass(frozen=True)
class Trajectory:
    """One multi-turn episode: the prompt, then model and environment segments in order.

    The trained sequence is ``token_ids``: the concatenation of the segments' ids, never a
    re-tokenised conversation; the loss covers model tokens only."""

    prompt_ids: tuple[int, ...]
    segments: tuple[Segment, ...]
    turns: tuple[TurnRecord, ...] = ()
    end: EpisodeEnd = "answer"
    env_reward: float | None = None
    """The environment's reward (sum of its step rewards) when it scores episodes itself, else None."""

    @property
    def response_ids(self) -> tuple[int, ...]:
        return tuple(t for seg in self.segments for t in seg.token_ids)

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The trained sequence: prompt + every segment's ids."""
        return self.prompt_ids + self.response_ids

    @property
    def loss_mask(self) -> tuple[int, ...]:
        """Per response token: 1 on model tokens, 0 on environment tokens."""
        return tuple(int(isinstance(seg, ModelSegment)) for seg in self.segments for _ in seg.token_ids)

    @property
    def behav_logprobs(self) -> tuple[float, ...]:
        """Per response token (0.0 on environment tokens)."""
        return tuple(
            lp
            for seg in self.segments
            for lp in (seg.behav_logprobs if isinstance(seg, ModelSegment) else (0.0,) * len(seg.token_ids))
        )

    @property
    def versions(self) -> tuple[int, ...]:
        """Per response token (-1 on environment tokens)."""
        return tuple(
            v
            for seg in self.segments
            for v in (seg.versions if isinstance(seg, ModelSegment) else (-1,) * len(seg.token_ids))
        )

    @property
    def model_segments(self) -> tuple[ModelSegment, ...]:
        return tuple(seg for seg in self.segments if isinstance(seg, ModelSegment))

    @property
    def min_version(self) -> int:
        """Staleness: the oldest version of any model token (-1 when there is none)."""
        versions = [v for seg in self.model_segments for v in seg.versions]
        return min(versions) if versions else -1

    @property
    def max_version(self) -> int:
        versions = [v for seg in self.model_segments for v in seg.versions]
        return max(versions) if versions else -1

    def to_completion(self) -> Completion:
        """The episode as one ``Completion`` (output = every segment after the prompt, with its
        ``loss_mask``): what groups, the buffer and the trainer consume."""
        model = self.model_segments
        return Completion(
            prompt_ids=self.prompt_ids,
            output_ids=self.response_ids,
            behav_logprobs=self.behav_logprobs,
            versions=self.versions,
            finish_reason=model[-1].finish_reason if model else "stop",
            num_interruptions=sum(seg.num_interruptions for seg in model),
            loss_mask=self.loss_mask,
        )


@dataclass(frozen=True)
class Group:
    """The G completions of one prompt with their rewards: the unit the buffer holds (a trajectory
    group in GRPO terms)."""

    prompt: Prompt
    completions: tuple[Completion, ...]
    rewards: tuple[float, ...]
    """One scalar reward per completion."""
    start_version: int
    """Policy version current when the group was admitted (what the staleness gate counted)."""
    reward_failures: tuple[str | None, ...] = ()
    """Per completion: None when the verifier ran, else why it could not (timeout, error). A
    failed verification is never silently a reward of 0: such samples are filtered."""
    trajectories: tuple[Trajectory, ...] = ()
    """Multi-turn workflows: the episode behind each completion (turns, tool calls, segments);
    empty for single-turn ones."""
    episodes: tuple[int, ...] = ()
    """Per completion, the index of the episode it came from, where an episode yields several samples (an
    ``openai_agent`` episode that branches, ``agent.episode_mode``): the group then holds every sample of
    its ``rollout.group_size`` episodes, however many. Empty: completion ``i`` is episode ``i``."""

    def __post_init__(self) -> None:
        if len(self.completions) != len(self.rewards):
            raise ValueError("Group: one reward per completion is required")
        if self.trajectories and len(self.trajectories) != len(self.completions):
            raise ValueError("Group: trajectories must be empty or one per completion")
        if self.episodes and len(self.episodes) != len(self.completions):
            raise ValueError("Group: episodes must be empty or one per completion")

    def sample_fields(self, idx: int) -> dict[str, int]:
        """Completion ``idx``'s ``episode`` and the group's size (``group_samples``) where episodes yield
        several samples (the ledger's), else nothing."""
        return {"episode": self.episodes[idx], "group_samples": len(self.completions)} if self.episodes else {}

    @property
    def min_version(self) -> int:
        """Oldest version behind any model token of the group."""
        versions = [c.min_version for c in self.completions if c.model_versions]
        return min(versions) if versions else self.start_version

    @property
    def max_version(self) -> int:
        """Newest version behind any model token of the group."""
        versions = [c.max_version for c in self.completions if c.model_versions]
        return max(versions) if versions else self.start_version


@dataclass(frozen=True)
class TrainSample:
    """One packed-ready training sequence (prompt + response), per-token aligned."""

    prompt_id: str
    sample_idx: int
    """Index of the completion within its group."""
    token_ids: tuple[int, ...]
    """Prompt followed by response token ids."""
    loss_mask: tuple[int, ...]
    """1 where the token is a response token the loss applies to; aligned with ``token_ids``
    (position t scores token t given tokens < t)."""
    behav_logprobs: tuple[float, ...]
    """Behaviour log-prob per position (0.0 where ``loss_mask`` is 0)."""
    advantages: tuple[float, ...]
    """Advantage per position (0.0 where ``loss_mask`` is 0)."""
    versions: tuple[int, ...]
    """Policy version per position (-1 where ``loss_mask`` is 0)."""
    min_version: int
    max_version: int
    reward: float = 0.0

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        for name in ("loss_mask", "behav_logprobs", "advantages", "versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"TrainSample.{name} has {len(getattr(self, name))} entries, want {n}")

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass(frozen=True)
class TrainBatch:
    """The samples of one training step and the trainer version they were packed for."""

    samples: tuple[TrainSample, ...]
    version: int
    """The trainer version (= step index) this batch is trained at."""


@dataclass(frozen=True)
class WeightUpdate:
    """A versioned weight-sync signal from the trainer to the engines (the loop's only back-edge).

    Exactly one of ``tensors`` / ``path`` / ``adapter`` is set, by the transport in use. ``tensors`` and
    ``path`` replace the weights (a *full* update); ``adapter`` ships only LoRA adapters, applied over the
    engine's base weights (only ``LocalEngine`` takes it; see ``rollout.adapters``)."""

    version: int
    tensors: dict[str, Any] | None = None
    """In-process transport: parameter name -> tensor (read-only for the receiver)."""
    path: str | None = None
    """Disk transport: a directory holding ``model.safetensors`` (Hugging Face names)."""
    adapter: dict[str, tuple[Any, Any, float]] | None = None
    """In-process LoRA transport: the Hugging Face name of each adapted linear layer (e.g.
    ``model.layers.0.self_attn.q_proj``) -> ``(A [rank, in], B [out, rank], scaling)``; that layer's weight
    is the base weight plus ``scaling * B @ A``, every other weight the base's."""

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.tensors, self.path, self.adapter)) != 1:
            raise ValueError("WeightUpdate needs exactly one of tensors, path or adapter")
