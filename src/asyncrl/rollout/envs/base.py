"""The ``Environment`` protocol of multi-turn episodes, its records, and ``ToolEnv``.

An environment is an async object: ``reset(prompt)`` opens an episode (the opening messages, the
tools' JSON schemas for the chat template, whether it scores the episode itself), ``step(turn)``
answers one model turn with messages (rendered by the workflow through the chat template) and says
whether the episode is done and with what reward; ``close()`` releases it. Environments see text
only: the workflow keeps the token ids the model sampled and never asks an environment for them.

``ToolEnv`` is the common case: each well-formed call of a turn runs on its ``Tool`` (concurrently,
each under a timeout, in order of the calls), each malformed call is answered with an error message
the model sees, and a turn with no call at all is the answer, judged by ``judge`` when the
environment scores its episodes. Tools are coroutines, so a slow one waits without blocking the
engine (a blocking tool runs in a thread: see ``python``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from asyncrl.rollout.tools import ParsedTurn, ToolCall
from asyncrl.types import EnvKind, Prompt

__all__ = [
    "EnvOptions",
    "EnvReset",
    "Environment",
    "Message",
    "ModelTurn",
    "StepResult",
    "Tool",
    "ToolEnv",
    "ToolError",
]


@dataclass(frozen=True)
class Message:
    """One chat message as the chat template takes it."""

    role: str
    """``system``, ``user``, ``assistant`` or ``tool`` (what the tokenizer's template knows)."""
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class EnvReset:
    """How an episode opens."""

    messages: tuple[Message, ...] = ()
    """The opening conversation, rendered by the workflow with the generation prompt. Empty: the
    prompt's own ``token_ids`` (rendered by ``data``) open the episode, as a user turn holding
    ``prompt.meta["question"]``."""
    tools: tuple[dict[str, Any], ...] = ()
    """JSON schemas of the tools, handed to the chat template as ``tools``."""
    tags: dict[str, tuple[str, str]] = field(default_factory=dict)
    """For the ``tag`` call format: short tag -> (tool name, argument name)."""
    scores: bool = False
    """True: the episode's reward is the sum of the step rewards (0.0 when cut short). False: the
    workflow's ``score`` callable computes it."""


@dataclass(frozen=True)
class ModelTurn:
    """One model turn as the environment sees it."""

    index: int
    """0 for the first turn."""
    text: str
    """The turn's decoded text (without an end-of-turn token the model sampled)."""
    parsed: ParsedTurn
    """Its tool calls and malformed calls, by the workflow's call format."""


@dataclass(frozen=True)
class StepResult:
    """The environment's answer to a turn."""

    messages: tuple[Message, ...] = ()
    """Appended to the conversation (tool results, an observation, error messages)."""
    done: bool = False
    reward: float | None = None
    """This step's reward (summed over the episode when the environment scores it)."""
    kind: EnvKind = "tool"
    tool_errors: int = 0
    """Well-formed calls whose tool failed (unknown, bad arguments, raised, timed out)."""
    tool_hits: int | None = None
    """Successful calls whose result is what the task needed (the environment's ``result_check``);
    None when the environment cannot tell."""


@runtime_checkable
class Environment(Protocol):
    """One episode's environment (a fresh one per episode)."""

    async def reset(self, prompt: Prompt) -> EnvReset:
        """Open the episode for ``prompt``."""
        ...

    async def step(self, turn: ModelTurn) -> StepResult:
        """Answer one model turn."""
        ...

    async def close(self) -> None:
        """Release what the episode holds (called once, however the episode ended)."""
        ...


@dataclass(frozen=True)
class EnvOptions:
    """What an environment maker of the registry (``envs.registry``) is called with, once per episode."""

    tool_timeout_s: float = 5.0
    """Longest wait on one tool call (``agent.tool_timeout_s``)."""
    seed: int = 0
    """The run's seed (``run.seed``)."""
    code_runner: Callable[[str], str] | None = None
    """Blocking: source code -> the text the model sees (the reward sandbox, handed in by ``launch``: rollout
    imports no reward code); None where the caller has none."""


class ToolError(Exception):
    """Raised by a tool: its message is shown to the model as the call's result."""


@dataclass(frozen=True)
class Tool:
    """A function the model may call."""

    name: str
    description: str
    parameters: dict[str, Any]
    """JSON schema of the arguments object."""
    run: Callable[[dict[str, Any]], Awaitable[str]]
    """The arguments -> the text the model sees; raises ``ToolError`` (or anything) on failure."""
    tag: str = ""
    """Short tag of the ``tag`` call format (``<tag>...</tag>``); empty: not callable that way."""
    arg: str = ""
    """The argument the ``tag`` format's body fills."""

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema chat templates render."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def error_text(message: str) -> str:
    """How an error reaches the model."""
    return f"error: {message}"


class ToolEnv:
    """Calls run on tools; a turn without a call is the answer (see the module docstring)."""

    def __init__(
        self,
        tools: tuple[Tool, ...],
        *,
        system: str = "",
        judge: Callable[[Prompt, str], float] | None = None,
        tool_timeout_s: float = 10.0,
        tool_role: str = "tool",
        result_check: Callable[[Prompt, str], bool] | None = None,
    ) -> None:
        """``system``: an opening system message (none when empty). ``judge(prompt, answer text)``:
        the reward of the answer turn; None leaves scoring to the workflow's ``score`` callable.
        ``result_check(prompt, result text)``: whether a successful call's result is the one the task
        needs (counted as ``StepResult.tool_hits``, a metric only, never a reward)."""
        self.result_check = result_check
        self.tools = {t.name: t for t in tools}
        self.system = system
        self.judge = judge
        self.tool_timeout_s = tool_timeout_s
        self.tool_role = tool_role
        self.prompt: Prompt | None = None

    async def reset(self, prompt: Prompt) -> EnvReset:
        question = prompt.meta.get("question")
        if not isinstance(question, str):
            raise ValueError(f"prompt {prompt.prompt_id}: a tool environment needs meta['question']")
        self.prompt = prompt
        opening = ((Message("system", self.system),) if self.system else ()) + (Message("user", question),)
        return EnvReset(
            messages=opening,
            tools=tuple(t.schema() for t in self.tools.values()),
            tags={t.tag: (t.name, t.arg) for t in self.tools.values() if t.tag},
            scores=self.judge is not None,
        )

    async def step(self, turn: ModelTurn) -> StepResult:
        if turn.parsed.is_answer:
            if self.prompt is None:
                raise RuntimeError("ToolEnv.step before reset")
            reward = self.judge(self.prompt, turn.text) if self.judge is not None else None
            return StepResult(done=True, reward=reward, tool_hits=0 if self.result_check is not None else None)
        results = await asyncio.gather(*(self._call(c) for c in turn.parsed.calls))
        messages = [Message(self.tool_role, text) for text, _ in results]
        messages += [Message(self.tool_role, error_text(e)) for e in turn.parsed.errors]
        failed = sum(1 for _, ok in results if not ok)
        hits = None
        if self.result_check is not None and self.prompt is not None:
            hits = sum(1 for text, ok in results if ok and self.result_check(self.prompt, text))
        kind = "tool" if turn.parsed.calls else "error"
        return StepResult(messages=tuple(messages), kind=kind, tool_errors=failed, tool_hits=hits)

    async def _call(self, call: ToolCall) -> tuple[str, bool]:
        """(text for the model, whether the tool succeeded)."""
        tool = self.tools.get(call.name)
        if tool is None:
            return error_text(f"unknown tool {call.name!r} (tools: {', '.join(sorted(self.tools))})"), False
        try:
            return str(await asyncio.wait_for(tool.run(call.arguments), self.tool_timeout_s)), True
        except TimeoutError:
            return error_text(f"{call.name} timed out after {self.tool_timeout_s:g}s"), False
        except ToolError as e:
            return error_text(str(e)), False
        except Exception as e:  # a tool's bug is the model's observation, not a crashed episode
            return error_text(f"{call.name} failed: {type(e).__name__}: {e}"), False

    async def close(self) -> None:
        self.prompt = None
