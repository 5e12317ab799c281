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

    def __post_init__(self) -> None:
        n = len(self.output_ids)
        if len(self.behav_logprobs) != n or len(self.versions) != n:
            raise ValueError(
                f"Completion: output_ids ({n}), behav_logprobs ({len(self.behav_logprobs)}) and "
                f"versions ({len(self.versions)}) must have the same length"
            )

    @property
    def min_version(self) -> int:
        """Oldest policy version behind any output token (-1 for an empty output)."""
        return min(self.versions) if self.versions else -1

    @property
    def max_version(self) -> int:
        """Newest policy version behind any output token (-1 for an empty output)."""
        return max(self.versions) if self.versions else -1


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

    def __post_init__(self) -> None:
        if len(self.completions) != len(self.rewards):
            raise ValueError("Group: one reward per completion is required")

    @property
    def min_version(self) -> int:
        """Oldest version behind any token of the group."""
        versions = [c.min_version for c in self.completions if c.versions]
        return min(versions) if versions else self.start_version

    @property
    def max_version(self) -> int:
        """Newest version behind any token of the group."""
        versions = [c.max_version for c in self.completions if c.versions]
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

    Exactly one of ``tensors`` / ``path`` is set, by the transport in use."""

    version: int
    tensors: dict[str, Any] | None = None
    """In-process transport: parameter name -> tensor (read-only for the receiver)."""
    path: str | None = None
    """Disk transport: a directory holding ``model.safetensors`` (Hugging Face names)."""

    def __post_init__(self) -> None:
        if (self.tensors is None) == (self.path is None):
            raise ValueError("WeightUpdate needs exactly one of tensors or path")
