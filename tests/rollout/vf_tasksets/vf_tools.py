"""A multi-turn verifiers taskset with a Python tool: multiply two numbers by calling ``mul`` (a ``vf.Toolset``
method marked ``@vf.tool``, an MCP tool), then answer; rewarded when the answer is the product and a tool
result was seen."""

from __future__ import annotations

import re

import verifiers.v1 as vf
from pydantic_config import BaseConfig


class MulData(vf.TaskData):
    answer: str = ""


class Arith(vf.Toolset[BaseConfig]):
    """Exposes ``arith_mul`` (the server's snake-cased name is the prefix)."""

    @vf.tool
    def mul(self, a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b


class MulTask(vf.Task[MulData]):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [Arith(BaseConfig())]

    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        numbers = re.findall(r"-?\d+", trace.last_reply)
        used = any(m.content == self.data.answer for m in trace.tool_messages)
        return float(bool(numbers) and numbers[-1] == self.data.answer and used)


class MulTaskset(vf.Taskset[MulTask]):
    def load(self):
        for i, (a, b) in enumerate([(12, 34), (56, 78), (91, 23), (45, 67), (89, 10), (11, 12)]):
            data = MulData(
                id=f"mul{i}",
                prompt=f"What is {a}*{b}? Use the tool.",
                answer=str(a * b),
                system_prompt="You can call arith_mul.",
            )
            yield MulTask(data, self.config.task)


__all__ = ["MulTaskset"]
