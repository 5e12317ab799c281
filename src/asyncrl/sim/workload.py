"""Response lengths of simulated groups: parametric, or replayed from a run's ledger.

Owns ``LengthSampler``: ``next_group()`` gives the G response lengths of one prompt group.

- ``constant``: every sample ``length_median`` tokens (hand-computable scenarios);
- ``lognormal``: a long tail like reasoning models. A group's scale is drawn per prompt
  (``log L ~ N(log median, sigma)``: easy and hard prompts) and each sample varies around it
  (``within_sigma``), so the samples of one group are correlated, as they are for a real prompt
  (a group waits for its longest sample); clipped to ``[1, max_new_tokens]``;
- ``ledger``: whole groups replayed from a run's ``trajectories.jsonl`` (field ``response_len`` of
  every sample that finished: trained, filtered, stale, skipped), drawn with replacement; a group
  of another size gives G lengths drawn from its own. Each replayed group also carries whether the
  run's filter rejected it (``replayed_filtered``), so that a simulation can keep the filter's
  dependence on the lengths (dynamic sampling rejects all-correct and all-wrong prompts, whose
  answers are not as long as the others'). With ``ordered``, the groups are first handed out in
  the order the run admitted them (its ``admitted`` rows' ``stream_index``), each once, and drawn
  after that: a simulation of the run itself then meets the run's own sequence of prompts (a short
  run's figures depend on which long groups came when, not only on their distribution).

Draws are made in numpy blocks and handed out as Python ints (the simulator asks for millions).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Literal

import numpy as np

from asyncrl.choices import check_choice
from asyncrl.controller.throughput import FINISHED, generated_tokens

LengthKind = Literal["constant", "lognormal", "ledger"]
"""``Scenario.lengths``: how response lengths are drawn (module docstring)."""


def ledger_path(path: str | Path) -> Path:
    """``trajectories.jsonl`` itself, or inside a run directory."""
    p = Path(path)
    if p.is_dir():
        p = p / "trajectories.jsonl"
    if not p.is_file():
        raise FileNotFoundError(f"no ledger at {p}")
    return p


def ledger_records(path: str | Path) -> tuple[list[tuple[list[int], bool]], list[int]]:
    """Every finished group of a ledger (one per prompt admission, in the ledger's order): the
    generated lengths of its samples (a response's tokens, or a multi-turn episode's model tokens:
    its environment's tokens are prefilled) and whether the filter rejected it (status
    ``filtered``); and the indices of those groups in the order the run admitted them (the groups
    whose ``admitted`` row carries a ``stream_index``)."""
    groups: dict[str, list[int]] = defaultdict(list)
    filtered: dict[str, bool] = {}
    admitted: dict[str, int] = {}
    for raw in ledger_path(path).read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(raw)
        except json.JSONDecodeError:
            continue
        key = f"{row.get('run_id')}/{row.get('prompt_id')}/{row.get('start_version')}"
        if row.get("status") == "admitted" and row.get("stream_index") is not None:
            admitted.setdefault(key, int(row["stream_index"]))
        elif (
            row.get("status") in FINISHED and row.get("response_len") is not None and row.get("sample_idx") is not None
        ):
            groups[key].append(generated_tokens(row))
            filtered[key] = row["status"] == "filtered"
    keys = [key for key, g in groups.items() if g]
    if not keys:
        raise ValueError(f"{path}: no finished sample with a response_len")
    index = {key: i for i, key in enumerate(keys)}
    order = [index[key] for key in sorted((k for k in keys if k in admitted), key=admitted.__getitem__)]
    return [(groups[key], filtered[key]) for key in keys], order


def ledger_groups(path: str | Path) -> list[list[int]]:
    """The generated lengths of every finished group of a ledger (``ledger_records`` without the fates)."""
    return [lengths for lengths, _ in ledger_records(path)[0]]


class LengthSampler:
    """The G response lengths of each new group (see the module docstring)."""

    def __init__(
        self,
        kind: LengthKind,
        group_size: int,
        max_new_tokens: int,
        *,
        median: float = 1000.0,
        sigma: float = 1.0,
        within_sigma: float = 0.3,
        ledger: str | Path | None = None,
        ordered: bool = False,
        seed: int = 0,
        block: int = 4096,
    ) -> None:
        check_choice(kind, LengthKind, "lengths")
        if group_size < 1 or max_new_tokens < 1 or median < 1 or sigma < 0 or within_sigma < 0:
            raise ValueError("group_size, max_new_tokens, median >= 1 and sigma, within_sigma >= 0 required")
        self.kind, self.g, self.cap = kind, group_size, max_new_tokens
        self.median, self.sigma, self.within = median, sigma, within_sigma
        self.rng = np.random.default_rng(seed)
        self.block = block
        if kind == "ledger" and not ledger:
            raise ValueError("lengths=ledger needs a ledger (a run directory or its trajectories.jsonl)")
        records, order = ledger_records(ledger) if kind == "ledger" and ledger else ([], [])
        self._order = order if ordered else []
        """Group indices still to hand out in the run's admission order (``ordered``)."""
        self._groups = [lengths for lengths, _ in records]
        self._filtered = [rejected for _, rejected in records]
        self._buf: list[list[int]] = []
        self._fates: list[bool] = []
        self.replayed_filtered: bool | None = None
        """Whether the ledger's filter rejected the group ``next_group`` last replayed (None: not a ledger)."""

    def _refill(self) -> None:
        n, g = self.block, self.g
        match self.kind:
            case "constant":
                length = int(min(self.cap, max(1, round(self.median))))
                self._buf = [[length] * g for _ in range(n)]
                return
            case "lognormal":
                scale = np.log(self.median) + self.sigma * self.rng.standard_normal((n, 1))
                lens = np.exp(scale + self.within * self.rng.standard_normal((n, g)))
            case "ledger":
                if self._order:
                    picks, self._order = self._order[:n], self._order[n:]
                else:
                    picks = self.rng.integers(0, len(self._groups), n).tolist()
                rows = []
                for i in picks:
                    grp = self._groups[i]
                    rows.append(grp if len(grp) == g else [grp[j] for j in self.rng.integers(0, len(grp), g).tolist()])
                lens = np.asarray(rows, dtype=np.float64)
                self._fates = [self._filtered[i] for i in reversed(picks)]
        self._buf = np.clip(np.rint(lens), 1, self.cap).astype(np.int64).tolist()
        self._buf.reverse()

    def next_group(self) -> list[int]:
        """The G response lengths of the next group (``replayed_filtered`` says its ledger fate)."""
        if not self._buf:
            self._refill()
        if self._fates:
            self.replayed_filtered = self._fates.pop()
        return self._buf.pop()

    def mean(self, groups: int = 20000) -> float:
        """Mean sample length, estimated from ``groups`` draws of a fresh sampler with the same
        settings (the analytic mean of a clipped log-normal is not worth the algebra)."""
        probe = LengthSampler(
            self.kind, self.g, self.cap, median=self.median, sigma=self.sigma, within_sigma=self.within, seed=12345
        )
        probe._groups, probe._filtered = self._groups, self._filtered
        total = sum(sum(probe.next_group()) for _ in range(groups))
        return total / (groups * self.g)
