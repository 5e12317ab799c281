"""The verifiers adapter: a verifiers (0.4) task played as an ``Environment``, its own rewards as the reward.

Owns ``agent.env=verifiers`` (registered in the project's ``pyproject.toml`` like a third party's entry
point). verifiers 0.4 (``import verifiers.v1 as vf``) describes an environment as a ``vf.Taskset`` yielding
``vf.Task`` objects: the task's data (``prompt``, ``system_prompt``, any fields of its ``TaskData`` subclass),
its tools (``Task.toolsets``: ``vf.Toolset`` servers whose ``@vf.tool`` methods are MCP tools) and its
scoring (``@vf.reward`` / ``@vf.metric`` methods, plugged reward functions and judges, run by ``Task.score``
over a ``vf.Trace``). verifiers runs the agent as a separate program behind an interception server; here
the project's own workflow plays the conversation on the run's engine, token for token, and this adapter
is the task's side of it:

- ``reset``: the task is rebuilt from the prompt (``data.verifiers`` puts the taskset id and the task's wire
  data in ``prompt.meta["verifiers"]``); the opening is its system prompt and prompt; its toolsets are set up
  in process (``setup``, ``setup_task``, registered on an ``mcp`` ``MCPServer`` as verifiers registers them)
  and their tools offered, named as verifiers' chat harness names them (``<server>_<tool>``, or bare);
- ``step``: a turn with calls runs each on its MCP tool (concurrently, each under ``tool_timeout_s``; a
  failure is the model's observation); a turn without a call is the answer: the conversation becomes a
  ``vf.Trace`` (messages, the assistant's calls and the tool results) and ``Task.score`` gives the reward
  (the weighted sum of its rewards, ``Trace.reward``). An episode cut short by a budget scores 0.

Not carried over: tasks that need a container (``NEEDS_CONTAINER``; refused in one line), runtime-dependent
rewards (``Task.score`` without a runtime skips them, as verifiers does offline), ``@vf.stop`` conditions and
the agent harness programs (the workflow is the harness).
"""

from __future__ import annotations

import asyncio
import functools
import json
from typing import TYPE_CHECKING, Any

from asyncrl.rollout.envs.base import EnvOptions, EnvReset, Message, ModelTurn, StepResult, error_text
from asyncrl.types import Prompt

if TYPE_CHECKING:
    import verifiers.v1 as vf

__all__ = ["META_KEY", "VerifiersEnv", "load_taskset", "make", "rebuild_task"]

META_KEY = "verifiers"
"""The ``Prompt.meta`` key holding ``{"taskset": id, "task": wire data}`` (set by ``data.verifiers``)."""


@functools.cache
def load_taskset(taskset_id: str) -> vf.Taskset:
    """The verifiers taskset ``taskset_id`` (an installed module exporting one ``vf.Taskset`` subclass in its
    ``__all__``), at its default config, through verifiers' own loader; ValueError (one line) otherwise."""
    from verifiers.v1.utils.loaders import load_taskset as vf_load
    from verifiers.v1.utils.loaders import taskset_config_type

    try:
        return vf_load(taskset_config_type(taskset_id)(id=taskset_id))
    except (ImportError, AttributeError, TypeError, ValueError) as e:
        raise ValueError(f"verifiers taskset {taskset_id!r}: {type(e).__name__}: {str(e).splitlines()[0]}") from None


def rebuild_task(entry: dict[str, Any]) -> vf.Task:
    """The ``vf.Task`` of a prompt's ``meta["verifiers"]`` entry (its class from the taskset)."""
    taskset = load_taskset(str(entry["taskset"]))
    task_cls = type(taskset).task_type()
    if task_cls.NEEDS_CONTAINER:
        raise ValueError(f"verifiers taskset {entry['taskset']!r}: its tasks need a container, which asyncrl lacks")
    data = task_cls.data_type().model_validate(entry["task"])
    return task_cls(data, taskset.config.task)


def _text(content: Any) -> str:
    from verifiers.v1.types import content_text

    return content if isinstance(content, str) else content_text(content)


class VerifiersEnv:
    """One episode of a verifiers task (see the module docstring)."""

    def __init__(self, tool_timeout_s: float = 10.0) -> None:
        self.tool_timeout_s = tool_timeout_s
        self.task: vf.Task | None = None
        self.messages: list[Any] = []
        """The conversation in verifiers' message types (for the trace)."""
        self.servers: dict[str, tuple[Any, str]] = {}
        """Offered tool name -> (its MCPServer, the tool's own name)."""
        self.schemas: list[dict[str, Any]] = []
        self._calls = 0

    async def reset(self, prompt: Prompt) -> EnvReset:
        import verifiers.v1 as vf

        entry = prompt.meta.get(META_KEY)
        if not isinstance(entry, dict):
            raise ValueError(f"prompt {prompt.prompt_id}: agent.env=verifiers needs task.name=verifiers prompts")
        self.task = task = rebuild_task(entry)
        data = task.data
        opening: list[Any] = [vf.SystemMessage(content=data.system_prompt)] if data.system_prompt else []
        if isinstance(data.prompt, str):
            opening.append(vf.UserMessage(content=data.prompt))
        else:
            opening.extend(data.prompt or [])
        self.messages = opening
        await self._open_tools(task)
        return EnvReset(
            messages=tuple(Message(m.role, _text(m.content) or "") for m in opening),
            tools=tuple(self.schemas),
            scores=True,
        )

    async def _open_tools(self, task: vf.Task) -> None:
        from mcp.server.mcpserver import MCPServer

        for toolset in type(task).toolsets(task.config):
            await toolset.setup()
            await toolset.setup_task(task)
            server = MCPServer(toolset.server_name or type(toolset).__name__)
            toolset.register(server)
            prefix = toolset.server_name
            for tool in await server.list_tools():
                name = f"{prefix}_{tool.name}" if prefix else tool.name
                if name in self.servers:
                    raise ValueError(f"verifiers task {type(task).__name__}: two tools named {name!r}")
                self.servers[name] = (server, tool.name)
                function = {"name": name, "description": tool.description or "", "parameters": tool.input_schema}
                self.schemas.append({"type": "function", "function": function})

    async def _call(self, name: str, arguments: dict[str, Any]) -> str:
        if name not in self.servers:
            return error_text(f"unknown tool {name!r} (tools: {', '.join(sorted(self.servers)) or 'none'})")
        server, raw = self.servers[name]
        try:
            result = await asyncio.wait_for(server.call_tool(raw, arguments), self.tool_timeout_s)
        except TimeoutError:
            return error_text(f"{name} timed out after {self.tool_timeout_s:g}s")
        except Exception as e:  # the tool's failure (bad arguments, a raise) is the model's observation
            return error_text(str(e).splitlines()[0] if str(e) else type(e).__name__)
        texts = [getattr(block, "text", None) or str(block) for block in result.content]
        text = "\n".join(texts)
        return error_text(text) if result.is_error else text

    async def step(self, turn: ModelTurn) -> StepResult:
        import verifiers.v1 as vf

        if self.task is None:
            raise RuntimeError("VerifiersEnv.step before reset")
        calls = turn.parsed.calls
        ids = [f"call_{self._calls + i}" for i in range(len(calls))]
        self._calls += len(calls)
        tool_calls = [
            vf.ToolCall(id=i, name=c.name, arguments=json.dumps(c.arguments)) for i, c in zip(ids, calls, strict=True)
        ]
        self.messages.append(vf.AssistantMessage(content=turn.text, tool_calls=tool_calls or None))
        if turn.parsed.is_answer:
            return StepResult(done=True, reward=await self.score())
        results = await asyncio.gather(*(self._call(c.name, c.arguments) for c in calls))
        for i, text in zip(ids, results, strict=True):
            self.messages.append(vf.ToolMessage(tool_call_id=i, content=text))
        messages = [Message("tool", text) for text in results]
        messages += [Message("tool", error_text(e)) for e in turn.parsed.errors]
        failed = sum(1 for text in results if text.startswith(error_text("")))
        return StepResult(messages=tuple(messages), kind="tool" if calls else "error", tool_errors=failed)

    def trace(self) -> vf.Trace:
        """The conversation so far as a ``vf.Trace`` of this task (the model's messages marked sampled)."""
        import verifiers.v1 as vf
        from verifiers.v1.graph import MessageNode
        from verifiers.v1.trace import AgentInfo, TraceTask

        assert self.task is not None
        nodes = [
            MessageNode(parent=i - 1 if i else None, message=m, sampled=m.role == "assistant")
            for i, m in enumerate(self.messages)
        ]
        task = TraceTask(type=type(self.task).__name__, data=self.task.data, key=self.task.key, hash=self.task.hash)
        tools = [
            vf.Tool(
                name=s["function"]["name"],
                description=s["function"]["description"],
                parameters=s["function"]["parameters"],
            )
            for s in self.schemas
        ]
        return vf.Trace(task=task, agent=AgentInfo(config=vf.AgentConfig()), nodes=nodes, tools=tools)

    async def score(self) -> float:
        """``Task.score`` over the conversation: the weighted sum of the task's rewards."""
        assert self.task is not None
        trace = self.trace()
        await self.task.score(trace)
        return float(trace.reward)

    async def close(self) -> None:
        self.servers.clear()
        self.task = None


def make(options: EnvOptions) -> VerifiersEnv:
    """The registry's maker (``agent.env=verifiers``): one episode's environment; the task comes with the prompt."""
    import verifiers.v1  # noqa: F401  (fails here, in one line at the start, when verifiers is not installed)

    return VerifiersEnv(options.tool_timeout_s)
