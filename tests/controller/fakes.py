"""Scripted stand-ins for the controller's seams: an engine, a trainer and a score, no model.

- ``ScriptedEngine`` (a ``RolloutEngine``): answers every prompt with ``group_size`` short
  completions stamped with the version it holds when the request starts. A ``Script`` per prompt
  (keyed by its token ids) makes it slow, hold a request until the engine reaches a version (so
  the group comes back stale), fail or hang the first calls. Sample i's first token is ``i % 2``
  (``uniform``: 0 for all), which the scripted score turns into its reward.
- ``ScriptedTrainer`` (a ``PolicyTrainer``): checks each batch's version, records it, sleeps
  ``step_s``, returns a non-applied step where scripted, raises ``Crash`` where scripted (a kill),
  and saves/loads checkpoints as JSON in ``trainer_state.pt`` (the name ``list_checkpoints`` looks for).
- ``scripted_score``: reward 1.0 for an odd first token; raises or reports a failure where scripted.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.rollout.api import SampleDone
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.workflow import ScoreFn
from asyncrl.types import Completion, Prompt, TrainBatch, WeightUpdate


@dataclass
class Script:
    """What happens to one prompt (defaults: answered at once, scored without trouble)."""

    delay_s: float = 0.0
    """Generation time of each sample (sample i ends after ``(i + 1) * delay_s``)."""
    tail_s: float = 0.0
    """Extra time of the last sample of the group (a long-tailed response)."""
    hold_until: int | None = None
    """The request returns only once the engine holds this version (its tokens keep the start version)."""
    fail: int = 0
    """The first ``fail`` generate calls raise."""
    hang: int = 0
    """The next ``hang`` calls never return (an episode timeout must end them)."""
    score_raises: int = 0
    """The first ``score_raises`` scorings of this prompt raise."""
    reward_failure: str | None = None
    """Every sample's verification fails with this reason."""
    uniform: bool = False
    """Every sample gets the same reward."""


class ScriptedEngine:
    """A ``RolloutEngine`` that follows per-prompt scripts (see the module docstring)."""

    reports_each_sample = True

    def __init__(self, scripts: dict[tuple[int, ...], Script] | None = None, version: int = 0) -> None:
        self.scripts = dict(scripts or {})
        self._version = version
        self._updated = asyncio.Event()
        self.calls: Counter[tuple[int, ...]] = Counter()
        self.updates: list[int] = []
        self.generated = 0
        self.in_flight = 0
        self.max_in_flight = 0

    @property
    def version(self) -> int:
        return self._version

    def start(self) -> None:
        pass

    async def generate(
        self, input_ids: Sequence[int], sampling: SamplingParams, n: int = 1, on_sample_done: SampleDone | None = None
    ) -> list[Completion]:
        key = tuple(input_ids)
        script = self.scripts.get(key, Script())
        self.calls[key] += 1
        call, version = self.calls[key], self._version
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if call <= script.fail:
                raise RuntimeError(f"scripted engine failure (call {call})")
            if call <= script.fail + script.hang:
                await asyncio.sleep(3600)
            out = []
            for i in range(n):
                await asyncio.sleep(script.delay_s + (script.tail_s if i == n - 1 else 0.0))
                if script.hold_until is not None and i == n - 1:
                    while self._version < script.hold_until:
                        await self._updated.wait()
                ids = (0 if script.uniform else i % 2, 5, 6)
                out.append(Completion(key, ids, (-0.5,) * len(ids), (version,) * len(ids), "stop"))
                self.generated += len(ids)
                if on_sample_done is not None:
                    on_sample_done(i)
            return out
        finally:
            self.in_flight -= 1

    async def update_weights(self, update: WeightUpdate) -> None:
        self._version = update.version
        self.updates.append(update.version)
        updated, self._updated = self._updated, asyncio.Event()
        updated.set()

    async def pause(self) -> None:
        pass

    async def resume(self) -> None:
        pass

    async def abort_all(self) -> int:
        return 0

    def stats(self) -> dict[str, float]:
        return {"generated_tokens": float(self.generated), "version": float(self._version)}

    def close(self) -> None:
        pass


class Crash(RuntimeError):
    """The scripted kill of a run (raised by ``ScriptedTrainer.train_step``)."""


@dataclass
class StepDone:
    """A ``TrainStepResult``."""

    version: int
    applied: bool
    metrics: dict[str, float]


@dataclass
class ScriptedTrainer:
    """A ``PolicyTrainer`` that trains nothing (see the module docstring)."""

    version: int = 0
    step_s: float = 0.0
    non_finite: frozenset[int] = frozenset()
    """Steps whose update is not applied (a non-finite loss)."""
    crash_at: int | None = None
    """The step at which ``train_step`` raises ``Crash``."""
    batches: list[TrainBatch] = field(default_factory=list)
    saved: list[str] = field(default_factory=list)
    step_metrics: dict[str, float] = field(default_factory=dict)
    """Extra metrics of every step (e.g. off-policy statistics that adaptive admission reads)."""

    def train_step(self, batch: TrainBatch) -> StepDone:
        assert batch.version == self.version, (batch.version, self.version)
        if batch.version == self.crash_at:
            raise Crash(f"killed at step {batch.version}")
        time.sleep(self.step_s)
        self.batches.append(batch)
        applied = batch.version not in self.non_finite
        self.version += 1
        return StepDone(self.version, applied, {"loss": 0.5 if applied else math.nan, **self.step_metrics})

    def export_weights(self) -> WeightUpdate:
        return WeightUpdate(version=self.version, tensors={})

    def save_checkpoint(
        self, directory: str | Path, extra: dict[str, Any] | None = None, tokenizer: Any = None
    ) -> None:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        (path / "trainer_state.pt").write_text(json.dumps({"version": self.version, "extra": extra}))

    def load_checkpoint(self, directory: str | Path) -> dict[str, Any] | None:
        state = json.loads((Path(directory) / "trainer_state.pt").read_text())
        self.version = int(state["version"])
        return state["extra"]

    def save_pretrained(self, directory: str | Path, tokenizer: Any = None) -> None:
        self.saved.append(str(directory))


def scripted_score(scripts: dict[tuple[int, ...], Script]) -> ScoreFn:
    """The score of a scripted run (see the module docstring)."""
    calls: Counter[tuple[int, ...]] = Counter()

    async def score(prompt: Prompt, completion: Completion) -> tuple[float, str | None]:
        script = scripts.get(prompt.token_ids, Script())
        calls[prompt.token_ids] += 1
        if calls[prompt.token_ids] <= script.score_raises:
            raise RuntimeError("scripted scoring error")
        return float(completion.output_ids[0] % 2), script.reward_failure

    return score
