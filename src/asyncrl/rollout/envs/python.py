"""The ``python`` environment: a tool that runs the model's code and shows it the output.

Owns the tool (``python``, argument ``code``, short tag ``python``) and its environment. The code
runs through a *runner* handed in, ``code -> text the model sees``: a blocking function, called in
a worker thread so the event loop (and the engine's other episodes) never waits on it. The
controller hands in the reward sandbox (``reward.python_tool.run_python``; rollout imports no
reward code). Answers are scored by the workflow's ``score`` callable (e.g. the math verifier), so
this environment does not judge them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from asyncrl.rollout.envs.base import EnvOptions, Tool, ToolEnv, ToolError

__all__ = ["CodeRunner", "PYTHON_SYSTEM", "make", "python_env", "python_tool"]

CodeRunner = Callable[[str], str]
"""Blocking: source code -> the text the model sees (output, or the error and its last lines)."""

PYTHON_SYSTEM = (
    "You can run Python code with the python tool; what it prints comes back. Put the final answer in \\boxed{}."
)


def python_tool(runner: CodeRunner) -> Tool:
    async def run(arguments: dict[str, Any]) -> str:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            raise ToolError("python takes one argument, `code` (non-empty source text)")
        return await asyncio.to_thread(runner, code)

    return Tool(
        name="python",
        description="Run a Python program and return what it prints.",
        parameters={
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the program; print the results"}},
            "required": ["code"],
        },
        run=run,
        tag="python",
        arg="code",
    )


def python_env(runner: CodeRunner, *, system: str = PYTHON_SYSTEM, tool_timeout_s: float = 20.0) -> ToolEnv:
    """A fresh python environment (one per episode). ``tool_timeout_s`` bounds the wait on the
    runner; the runner enforces its own limit on the program (the sandbox kills it)."""
    return ToolEnv((python_tool(runner),), system=system, tool_timeout_s=tool_timeout_s)


def make(options: EnvOptions) -> ToolEnv:
    """The registry's maker of ``agent.env=python`` (entry point ``python`` of ``asyncrl.environments``): its
    runner is ``options.code_runner`` (the reward sandbox ``launch`` hands in)."""
    if options.code_runner is None:
        raise ValueError("agent.env=python needs a code runner (launch hands in the reward sandbox)")
    return python_env(options.code_runner, tool_timeout_s=options.tool_timeout_s)
