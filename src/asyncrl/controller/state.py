"""The controller's run counters (``ControllerState``): what a run counts and a checkpoint saves."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ControllerState:
    """What the controller counts over a run (also what a checkpoint saves)."""

    step: int = 0
    trained_tokens: int = 0
    trained_samples: int = 0
    admitted: int = 0
    readmitted: int = 0
    filtered_groups: int = 0
    stale_groups: int = 0
    reward_failures: int = 0
    skipped_steps: int = 0
    engine_failures: int = 0
    """Episodes dropped after all their retries."""
    episode_retries: int = 0
    max_staleness_seen: int = 0
    staleness_hist: Counter = field(default_factory=Counter)
    rl_elapsed_s: float = 0.0
    """RL wall time of the run (across resumes; the time lost between a checkpoint and a kill excluded)."""
    resumes: int = 0
    stop_reason: str | None = None
    """None: ran to its end (``total_steps``, or the RL-time budget ``max_rl_time_s``); else why it
    stopped early and can resume (e.g. ``SIGTERM``)."""

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["staleness_hist"] = {str(k): int(v) for k, v in self.staleness_hist.items()}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ControllerState:
        names = {f.name for f in dataclasses.fields(cls)}
        state = cls(**{k: v for k, v in data.items() if k in names and k != "staleness_hist"})
        state.staleness_hist = Counter({int(k): int(v) for k, v in data.get("staleness_hist", {}).items()})
        return state

    def summary(self) -> dict[str, Any]:
        """The counters as ``summary.json`` reports them (steps, how the run ended, tokens and rates,
        staleness, the fate counts); ``trained_tokens_per_s`` over the RL wall time."""
        rl_wall = self.rl_elapsed_s
        return {
            "steps": self.step,
            "stop_reason": self.stop_reason,
            "resumes": self.resumes,
            "rl_wall_s": rl_wall,
            "trained_tokens": self.trained_tokens,
            "trained_samples": self.trained_samples,
            "trained_tokens_per_s": self.trained_tokens / rl_wall if rl_wall > 0 else 0.0,
            "max_staleness_seen": self.max_staleness_seen,
            "staleness_hist": {str(k): v for k, v in sorted(self.staleness_hist.items())},
            "admitted_prompts": self.admitted,
            "readmitted_prompts": self.readmitted,
            "filtered_groups": self.filtered_groups,
            "stale_groups": self.stale_groups,
            "reward_failures": self.reward_failures,
            "engine_failures": self.engine_failures,
            "episode_retries": self.episode_retries,
            "skipped_steps": self.skipped_steps,
        }
