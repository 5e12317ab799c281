"""``PolicyTrainer``: what the controller and the launcher's runner may ask of a trainer.

Owns the seam between the controller and training. The implementations satisfy it structurally
(no base class): ``trainer.trainer.Trainer`` (in this process),
``launch.trainer_process.TrainerProcess`` (the same, in a child process behind a pipe) and
``launch.ray_clients.RayTrainerGroup`` (FSDP2 ranks as Ray actors). ``tests/trainer/test_api.py``
checks each one against it.

The members are exactly those called across the seam: ``version``, ``train_step`` and
``export_weights`` by the loop (``controller.loop``); ``save_checkpoint`` by its checkpoints;
``save_pretrained`` by its policy snapshots and the runner's final checkpoint; ``load_checkpoint``
by the runner's resume. A step's result is read through ``TrainStepResult`` (the trainer's
``StepResult`` satisfies it), so the controller needs no trainer import at run time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from asyncrl.types import TrainBatch, WeightUpdate

__all__ = ["PolicyTrainer", "TrainStepResult"]


@runtime_checkable
class TrainStepResult(Protocol):
    """What one training step did (``trainer.trainer.StepResult``)."""

    @property
    def version(self) -> int:
        """The version this step published (the step index + 1)."""
        ...

    @property
    def applied(self) -> bool:
        """False when the step's update was skipped (non-finite loss or gradient)."""
        ...

    @property
    def metrics(self) -> dict[str, float]:
        """The step's loss and diagnostics (merged into the step's ``metrics.jsonl`` line)."""
        ...


@runtime_checkable
class PolicyTrainer(Protocol):
    """Owns the policy being optimised and its version; steps, exports weights, checkpoints."""

    @property
    def version(self) -> int:
        """Training steps taken (the version ``export_weights`` publishes)."""
        ...

    def train_step(self, batch: TrainBatch) -> TrainStepResult:
        """One training step on ``batch`` (packed for ``version``); publishes ``version + 1``."""
        ...

    def export_weights(self) -> WeightUpdate:
        """The current weights for the engines, stamped with ``version``."""
        ...

    def save_checkpoint(
        self, directory: str | Path, extra: dict[str, Any] | None = None, tokenizer: Any = None
    ) -> None:
        """Weights and the full training state into ``directory``; ``extra`` (plain values) comes
        back from ``load_checkpoint``."""
        ...

    def load_checkpoint(self, directory: str | Path) -> dict[str, Any] | None:
        """Restore what ``save_checkpoint`` wrote; returns its ``extra``."""
        ...

    def save_pretrained(self, directory: str | Path, tokenizer: Any = None) -> None:
        """The current weights as a Hugging Face checkpoint (+ tokenizer)."""
        ...
