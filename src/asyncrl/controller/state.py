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
