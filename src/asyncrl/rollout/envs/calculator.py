"""The ``calculator`` environment: arithmetic too large to do in one's head, with a calculator tool.

Owns the tool (``calculator``, argument ``expression``, short tag ``calc``: ``<calc>48213*379</calc>``),
its evaluator and the verifier of the final answer. The evaluator reads the expression's syntax
tree and allows integers and decimals, ``+ - * / // % **`` and parentheses, nothing else (no names,
no calls); operands and results are bounded so that no expression can stall the event loop.
Integer arithmetic is exact; ``/`` gives an exact integer when it divides, else a decimal.

The answer turn is right when its final number equals the reference (``prompt.answer``): the
number after the last ``#`` (the tiny model's convention, ``#18272727``), else the last
``\\boxed{...}``, else the turn's last number. Only the answer turn is read, never tool output.
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction
from typing import Any

from asyncrl.rollout.envs.base import EnvOptions, Tool, ToolEnv, ToolError
from asyncrl.types import Prompt

__all__ = [
    "CALCULATOR_SYSTEM",
    "calculator_env",
    "calculator_reward",
    "calculator_tool",
    "evaluate_expression",
    "make",
]

MAX_DIGITS = 60
"""Largest operand or result, in decimal digits."""
MAX_EXPONENT = 64
MAX_LENGTH = 200
"""Longest expression, in characters."""

CALCULATOR_SYSTEM = (
    "You can use a calculator. Call it with the expression to evaluate; its result comes back. "
    "End with the final answer after '#'."
)

_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,
}


def _check_size(value: Fraction) -> Fraction:
    if len(str(abs(value.numerator))) > MAX_DIGITS or len(str(value.denominator)) > MAX_DIGITS:
        raise ToolError(f"number too large (more than {MAX_DIGITS} digits)")
    return value


def _eval(node: ast.AST) -> Fraction:
    match node:
        case ast.Expression(body=body):
            return _eval(body)
        case ast.Constant(value=bool()):
            raise ToolError("only numbers are allowed")
        case ast.Constant(value=int() | float() as v):
            return _check_size(Fraction(str(v)))
        case ast.UnaryOp(op=ast.USub(), operand=x):
            return -_eval(x)
        case ast.UnaryOp(op=ast.UAdd(), operand=x):
            return _eval(x)
        case ast.BinOp(left=left, op=op, right=right) if type(op) in _OPS:
            a, b = _eval(left), _eval(right)
            if isinstance(op, ast.Div | ast.FloorDiv | ast.Mod) and b == 0:
                raise ToolError("division by zero")
            if isinstance(op, ast.Pow) and (b.denominator != 1 or abs(b) > MAX_EXPONENT):
                raise ToolError(f"exponents must be integers of at most {MAX_EXPONENT}")
            if isinstance(op, ast.Pow) and a == 0 and b < 0:
                raise ToolError("division by zero")
            return _check_size(_OPS[type(op)](a, b))
        case _:
            raise ToolError(f"unsupported syntax: {type(node).__name__}")


def format_number(value: Fraction) -> str:
    """An integer exactly; otherwise a decimal with up to 10 places."""
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(value):.10f}".rstrip("0").rstrip(".")
    return text if text not in ("-0", "") else "0"


def evaluate_expression(expression: str) -> str:
    """The value of an arithmetic expression, as text; ``ToolError`` says what is wrong."""
    expression = expression.strip().replace("^", "**").replace("×", "*").replace(",", "")
    if not expression:
        raise ToolError("empty expression")
    if len(expression) > MAX_LENGTH:
        raise ToolError(f"expression longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise ToolError(f"cannot parse {expression!r}") from None
    return format_number(_eval(tree))


async def _run(arguments: dict[str, Any]) -> str:
    expression = arguments.get("expression")
    if not isinstance(expression, str):
        raise ToolError("calculator takes one argument, `expression` (a string)")
    return evaluate_expression(expression)


def calculator_tool() -> Tool:
    return Tool(
        name="calculator",
        description="Evaluate an arithmetic expression (+ - * / // % ** and parentheses) exactly.",
        parameters={
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 48213*379"}},
            "required": ["expression"],
        },
        run=_run,
        tag="calc",
        arg="expression",
    )


_HASH = re.compile(r"#\s*(-?[\d,]*\.?\d+)")
_BOXED = re.compile(r"\\boxed\{\s*(-?[\d,]*\.?\d+)\s*\}")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_number(text: str) -> str | None:
    """The answer turn's final number (see the module docstring), or None."""
    for pattern in (_HASH, _BOXED, _NUMBER):
        found = pattern.findall(text)
        if found:
            return found[-1].replace(",", "")
    return None


def calculator_reward(prompt: Prompt, answer_text: str) -> float:
    """1.0 when the answer turn's final number equals ``prompt.answer``, else 0.0."""
    got = final_number(answer_text)
    if got is None:
        return 0.0
    try:
        return float(Fraction(got) == Fraction(prompt.answer.strip().replace(",", "")))
    except (ValueError, ZeroDivisionError):
        return 0.0


def calculator_env(*, system: str = CALCULATOR_SYSTEM, tool_timeout_s: float = 5.0) -> ToolEnv:
    """A fresh calculator environment (one per episode); it scores its episodes itself, and counts a
    call whose result is the reference answer as a hit (``StepResult.tool_hits``)."""
    return ToolEnv(
        (calculator_tool(),),
        system=system,
        judge=calculator_reward,
        tool_timeout_s=tool_timeout_s,
        result_check=lambda prompt, result: calculator_reward(prompt, result) == 1.0,
    )


def make(options: EnvOptions) -> ToolEnv:
    """The registry's maker of ``agent.env=calculator`` (entry point ``calculator`` of ``asyncrl.environments``)."""
    return calculator_env(tool_timeout_s=options.tool_timeout_s)
