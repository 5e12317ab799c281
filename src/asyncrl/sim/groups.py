"""A simulated prompt group, and the record of it that the controller's buffer holds.

Owns ``SimGroup`` (one admitted group as the engines and the simulated controller see it) and
``BufferedGroup`` (a real ``types.Group`` standing for it in ``controller.buffer.GroupBuffer``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asyncrl.types import Group, Prompt


class SimGroup:
    """One admitted prompt group (see the module docstring)."""

    __slots__ = (
        "gid",
        "prompt_len",
        "lengths",
        "left",
        "pending",
        "last_end",
        "admit_version",
        "min_version",
        "max_version",
        "engine",
        "report",
        "live",
        "interrupts",
        "finish_t",
        "samples",
        "status",
        "bound",
        "rejected",
    )

    def __init__(self, gid: int, prompt_len: int, lengths: list[int], admit_version: int) -> None:
        self.gid = gid
        self.prompt_len = prompt_len
        self.lengths = lengths
        """Response length of every sample (drawn at admission)."""
        self.left = len(lengths)
        """Samples not yet ended."""
        self.pending = len(lengths)
        """Samples waiting to join (again, after an abort) an engine's batch."""
        self.last_end = -1
        """Engine step at which its last running sample ends (valid once ``pending == 0``)."""
        self.admit_version = admit_version
        self.min_version = 1 << 60
        """Engine version when the group's first token was sampled (the oldest of any token)."""
        self.max_version = -1
        self.engine = -1
        self.report: Callable[[int], None] | None = None
        """Per-sample end callback of the controller (``EpisodeSamples.attempt()``), if reported."""
        self.live: Any = None
        self.interrupts = 0
        """Weight updates that interrupted any of its samples (summed over samples)."""
        self.finish_t = 0.0
        self.samples: list[tuple[int, int, int]] | None = None
        """(length, interruptions, version at its end) of each ended sample, kept for the ledger."""
        self.status = "running"
        self.bound: int | None = None
        """Its own staleness bound: the η_t in force when it was admitted (adaptive admission), else None."""
        self.rejected: bool | None = None
        """The filter's verdict replayed from a ledger (``Scenario.ledger_filter``); None: a coin decides."""

    @property
    def tokens(self) -> int:
        """Trained tokens of the group: every sample's prompt + response."""
        return self.prompt_len * len(self.lengths) + sum(self.lengths)


SIM_PROMPT = Prompt(prompt_id="simulated", token_ids=())


@dataclass(frozen=True)
class BufferedGroup(Group):
    """The ``types.Group`` the buffer holds for a simulated group: no completions, its oldest token
    version stored (``take_fresh`` reads ``min_version`` twice per buffered group per call, and the
    buffer holds thousands of groups at scale: a stored value, not a scan of completions), and the
    simulated group it stands for."""

    oldest: int = 0
    sim: SimGroup | None = None

    @property
    def min_version(self) -> int:
        return self.oldest


def simulated(record: Group) -> SimGroup:
    """The simulated group behind a buffer record."""
    assert isinstance(record, BufferedGroup) and record.sim is not None
    return record.sim


def buffer_record(grp: SimGroup) -> BufferedGroup:
    return BufferedGroup(
        prompt=SIM_PROMPT,
        completions=(),
        rewards=(),
        start_version=grp.admit_version,
        oldest=grp.min_version,
        sim=grp,
    )
