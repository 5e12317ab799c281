"""A single-turn verifiers taskset: add two small numbers, answer after '#'; reward 1 when the last reply's
final number is the sum (an async ``@vf.reward``) plus a weighted formatting reward (a sync one is refused by
verifiers' ``Task.score``, which awaits every reward)."""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str = ""


class SumTask(vf.Task[SumData]):
    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        numbers = re.findall(r"-?\d+", trace.last_reply.rsplit("#", 1)[-1])
        return float(bool(numbers) and numbers[-1] == self.data.answer)

    @vf.reward(weight=0.5)
    async def has_hash(self, trace: vf.Trace) -> float:
        return float("#" in trace.last_reply)


class SumTaskset(vf.Taskset[SumTask]):
    def load(self):
        rng = random.Random(0)
        for i in range(64):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            data = SumData(id=f"sum{i}", name="add", prompt=f"{a}+{b}=?", answer=str(a + b))
            yield SumTask(data, self.config.task)


__all__ = ["SumTaskset"]
