"""Faults inside a run: engine requests that fail or hang are retried; a non-finite step is skipped.

The real loop (tiny random-init model, LocalEngine, Trainer) with an engine wrapper that makes
some ``generate`` calls raise and one hang past ``controller.episode_timeout_s``, and a score
function that gives one prompt a NaN reward (so the loss of the step that trains it is NaN).
Synchronous (η = 0): step 0 needs exactly the first B admitted groups, the hung one included, so
the timeout must fire and the retry must be served before the run can go on.
"""

from __future__ import annotations

import asyncio
import copy
import math
from collections import Counter
from pathlib import Path
from typing import Any

from asyncrl.config import load_config, to_dict
from asyncrl.controller.loop import Controller
from asyncrl.controller.resume import prompt_at
from asyncrl.controller.rundir import RunDir, read_jsonl
from asyncrl.controller.scoring import make_score_fn
from asyncrl.data.prompts import PromptSource, build_task
from asyncrl.launch.runner import loop_settings
from asyncrl.models import load_policy, stop_token_ids
from asyncrl.rollout.engine import LocalEngine
from asyncrl.trainer.trainer import Trainer


class FlakyEngine:
    """Delegates to a real engine; generate calls number ``fail`` raise, number ``hang`` hangs."""

    def __init__(self, engine: LocalEngine, fail: set[int], hang: set[int]) -> None:
        self.engine, self.fail, self.hang, self.calls = engine, fail, hang, 0
        self.hung: list[tuple[int, ...]] = []  # prompts of the calls that hung
        self.served: list[tuple[int, ...]] = []  # prompts of the calls that returned

    async def generate(self, input_ids: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls in self.fail:
            raise RuntimeError(f"injected engine failure (call {self.calls})")
        if self.calls in self.hang:
            self.hung.append(tuple(input_ids))
            await asyncio.sleep(3600)
        out = await self.engine.generate(input_ids, *args, **kwargs)
        self.served.append(tuple(input_ids))
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def test_retries_timeouts_and_a_skipped_non_finite_step(tiny_policy_dir: Path, tmp_path: Path) -> None:
    steps, batch, group = 8, 4, 4
    cfg = load_config(
        None,
        [
            f"controller.total_steps={steps}",
            f"controller.batch_size={batch}",
            "controller.max_concurrent=8",
            "controller.max_staleness=0",
            "controller.episode_timeout_s=5",
            "controller.episode_retries=2",
            "controller.checkpoint_every=0",
            f"rollout.group_size={group}",
            "rollout.max_new_tokens=16",
            "rollout.max_slots=32",
            "task.train_size=200",
            "algo.filter_equal_rewards=false",
            "run.progress=false",
        ],
    )

    async def run() -> Any:
        model, tok = load_policy(tiny_policy_dir)
        engine = LocalEngine(copy.deepcopy(model), tok, max_slots=32, max_seq_len=600)
        flaky = FlakyEngine(engine, fail={2, 5}, hang={3})
        trainer = Trainer(model, cfg.trainer, cfg.algo)
        prompts, _, _ = build_task(cfg.task, tok)
        source = PromptSource(prompts, 0)
        poisoned = prompt_at(source, 0).prompt_id
        inline = make_score_fn("arithmetic", tok)

        async def score(prompt: Any, completion: Any) -> tuple[float, str | None]:
            reward, failure = await inline(prompt, completion)
            return (math.nan if prompt.prompt_id == poisoned else reward), failure

        rundir = RunDir(tmp_path, to_dict(cfg), tensorboard=False)
        controller = Controller(loop_settings(cfg, stop_token_ids(tok, model)), flaky, trainer, source, score, rundir)
        try:
            state = await controller.run()
        finally:
            engine.close()
            rundir.close()
        return state, poisoned, trainer, flaky

    state, poisoned, trainer, flaky = asyncio.run(run())
    assert state.step == steps and trainer.version == steps
    assert len(flaky.hung) == 1 and flaky.hung[0] in flaky.served  # timed out, then retried and served
    assert state.episode_retries >= 3  # two failures and one timeout, each retried
    assert state.engine_failures == 0  # every retried episode succeeded within its retries
    ledger = read_jsonl(tmp_path / "trajectories.jsonl")
    assert not [r for r in ledger if r["status"] == "engine_failure"]
    skipped = [r for r in ledger if r["status"] == "skipped"]
    assert {r["prompt_id"] for r in skipped} >= {poisoned} and all(r["dropped"] == "non_finite_step" for r in skipped)
    assert len(skipped) == batch * group and state.skipped_steps == 1
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    bad = [m for m in metrics if not m["applied"]]
    assert len(bad) == 1 and bad[0]["loss"] is None and bad[0]["step"] == skipped[0]["step"]
    trained = Counter(r["trained_step"] for r in ledger if r["status"] == "trained")
    assert trained == {s: batch * group for s in range(steps) if s != bad[0]["step"]}
    assert state.trained_samples == (steps - 1) * batch * group
