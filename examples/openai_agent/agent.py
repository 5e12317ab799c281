"""Agents written only against the ``openai`` client, trainable by asyncrl through its OpenAI-compatible door.

Nothing here imports asyncrl. Each agent is a function ``(base_url, api_key, task) -> reward | None``:

- ``solve``: asks the question of the synthetic arithmetic task (``task["question"]``); when the reply
  holds no final ``#<integer>``, asks once more for it (a second turn); returns 1.0 when the final
  answer equals ``task["answer"]``, else 0.0. Trains the tiny default policy (``README.md``).
- ``solve_with_tools``: the same task for a chat model that calls tools (``tools=[calculator]``, the
  Hermes ``<tool_call>`` format on the server side): runs each requested calculation and sends the
  result back as a ``tool`` message, up to ``MAX_TURNS`` turns; returns None, so that the run's
  verifier scores the episode (or, outside training, ``POST <base_url>/../end`` could report one).

Train one (see ``README.md``)::

    PYTHONPATH=. asyncrl train --set rollout.workflow=openai_agent \
        --set agent.entrypoint=examples.openai_agent.agent:solve
"""

from __future__ import annotations

import ast
import json
import operator
import re
from typing import Any

from openai import OpenAI

MAX_TURNS = 4
FINAL = re.compile(r"#(-?\d+)")
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression (+, -, *, //, parentheses) exactly.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 48213*379"}},
            "required": ["expression"],
        },
    },
}


def final_answer(text: str | None) -> int | None:
    """The integer after the last ``#`` in ``text``, or None."""
    found = FINAL.findall(text or "")
    return int(found[-1]) if found else None


def solve(base_url: str, api_key: str, task: dict[str, Any]) -> float:
    """One arithmetic problem, at most two turns; the reward is the agent's own check."""
    with OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        messages: list[Any] = [{"role": "user", "content": task["question"]}]
        reply = client.chat.completions.create(model="policy", messages=messages)
        choice = reply.choices[0]
        answer = final_answer(choice.message.content)
        if answer is None and choice.finish_reason == "stop":
            messages += [choice.message, {"role": "user", "content": "Give the final answer as #<number>."}]
            reply = client.chat.completions.create(model="policy", messages=messages)
            answer = final_answer(reply.choices[0].message.content)
    return 1.0 if answer is not None and str(answer) == str(task["answer"]).strip() else 0.0


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def calculate(expression: str) -> str:
    """Exact integer arithmetic on ``expression`` (no names, no calls), or an error text."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise ValueError("only integers, + - * // and parentheses")

    try:
        return str(value(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        return f"error: {e}"


def solve_with_tools(base_url: str, api_key: str, task: dict[str, Any]) -> None:
    """Tool use through ``tool_calls``; the run's verifier scores the final answer."""
    with OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        return _tool_loop(client, task)


def _tool_loop(client: OpenAI, task: dict[str, Any]) -> None:
    messages: list[Any] = [
        {"role": "system", "content": "Use the calculator for arithmetic. End with #<answer>."},
        {"role": "user", "content": task["question"]},
    ]
    for _ in range(MAX_TURNS):
        choice = client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR]).choices[0]
        if choice.finish_reason != "tool_calls" or not choice.message.tool_calls:
            return None
        messages.append(choice.message)
        for call in choice.message.tool_calls:
            try:
                expression = str(json.loads(call.function.arguments).get("expression", ""))
            except (json.JSONDecodeError, AttributeError):
                expression = ""
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(expression)})
    return None
