"""Policy snapshots of a run: the published policy saved now and then, with its version and RL time.

``controller.snapshot_every_s`` > 0: the controller saves the starting policy, then the published
policy whenever that many seconds of RL time passed since the last snapshot, and the final one,
each as a Hugging Face checkpoint ``RUN_DIR/snapshots/v<version>`` listed in ``snapshots.jsonl``.
``python -m benchmarks headline`` evaluates them after the run, so that measuring accuracy against wall
time costs the run only the save, on the trainer's executor between two steps (7 ms on average,
17 ms at most, over the 61 snapshots of docs/results/bench_headline_reason.json).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from asyncrl.trainer.api import PolicyTrainer


class PolicySnapshots:
    """Decides when a snapshot is due and saves it through the trainer (on the trainer's executor)."""

    def __init__(self, every_s: float, run_dir: Path, log: Any) -> None:
        """``log``: called with one record per snapshot (``RunDir.log_snapshot``)."""
        self.every_s = every_s
        self.run_dir = Path(run_dir)
        self._log = log
        self._last: tuple[int, float] | None = None  # (version, RL time) of the newest snapshot

    def due(self, version: int, t: float, *, final: bool = False) -> bool:
        """Whether the policy of ``version``, published at RL time ``t``, should be saved."""
        if self.every_s <= 0 or (self._last is not None and self._last[0] == version):
            return False
        return final or self._last is None or t - self._last[1] >= self.every_s

    async def maybe_save(
        self,
        executor: Executor,
        trainer: PolicyTrainer,
        tokenizer: Any,
        version: int,
        step: int,
        t: float,
        *,
        final: bool = False,
    ) -> None:
        """Save the trainer's current policy as ``version`` (published at RL time ``t``) if due."""
        if not self.due(version, t, final=final):
            return
        directory = self.run_dir / "snapshots" / f"v{version:06d}"
        t0 = time.perf_counter()
        await asyncio.get_running_loop().run_in_executor(executor, trainer.save_pretrained, directory, tokenizer)
        save_s = time.perf_counter() - t0
        self._log({"version": version, "step": step, "t": t, "path": str(directory), "save_s": save_s})
        self._last = (version, t)
