"""Environments: the calculator (evaluator, tool, verifier), ToolEnv's calls, errors and timeouts,
the python tool over a runner in a thread, and the gym adapter over sync and async text gyms."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from asyncrl.rollout.envs.base import Environment, Message, ModelTurn, Tool, ToolEnv, ToolError
from asyncrl.rollout.envs.calculator import calculator_env, calculator_reward, evaluate_expression, final_number
from asyncrl.rollout.envs.gym import GymAdapter
from asyncrl.rollout.envs.python import python_env
from asyncrl.rollout.tools import ParsedTurn, ToolCall, parse_tool_calls
from asyncrl.types import Prompt

PROMPT = Prompt("p", (), answer="18272727", meta={"question": "What is 48213*379?"})


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def turn(text: str, fmt: str = "tag", tags: dict | None = None, index: int = 0) -> ModelTurn:
    return ModelTurn(index, text, parse_tool_calls(fmt, text, tags or {"calc": ("calculator", "expression")}))


def test_evaluator_is_exact_and_refuses_everything_else() -> None:
    assert evaluate_expression("48213*379") == "18272727"
    assert evaluate_expression(" (2+3)**2 - 7 // 2 ") == "22"
    assert evaluate_expression("10/4") == "2.5" and evaluate_expression("9/3") == "3"
    assert evaluate_expression("123456789123456789*987654321987654321") == str(123456789123456789 * 987654321987654321)
    assert evaluate_expression("1,000 * 3") == "3000" and evaluate_expression("2^10") == "1024"
    for bad, message in {
        "__import__('os')": "unsupported",
        "x+1": "unsupported",
        "1/0": "division by zero",
        "2**1000": "exponents",
        "9" * 61: "too large",
        "": "empty",
        "1+": "cannot parse",
        "True+1": "only numbers",
    }.items():
        with pytest.raises(ToolError, match=message):
            evaluate_expression(bad)


def test_final_answer_verifier() -> None:
    assert final_number("so the result is #18,272,727") == "18272727"
    assert final_number("\\boxed{42} and 7") == "42" and final_number("it is 12 or 13") == "13"
    assert final_number("no number") is None
    assert calculator_reward(PROMPT, "#18272727") == 1.0
    assert calculator_reward(PROMPT, "18272727 is my guess, #18272728") == 0.0
    assert calculator_reward(PROMPT, "I do not know") == 0.0


def test_calculator_episode_steps() -> None:
    async def go():
        env = calculator_env()
        assert isinstance(env, Environment)
        reset = await env.reset(PROMPT)
        assert reset.scores and reset.tags == {"calc": ("calculator", "expression")}
        assert [m.role for m in reset.messages] == ["system", "user"]
        assert reset.tools[0]["function"]["name"] == "calculator"
        first = await env.step(turn("<calc>48213*379</calc>"))
        bad = await env.step(turn("<calc>48213*</calc><calc>1"))
        last = await env.step(turn("#18272727"))
        await env.close()
        return first, bad, last

    first, bad, last = run(go())
    assert first.messages == (Message("tool", "18272727"),) and not first.done and first.reward is None
    assert bad.tool_errors == 1 and [m.content[:6] for m in bad.messages] == ["error:"] * 2  # failed + malformed
    assert "cannot parse" in bad.messages[0].content and "not closed" in bad.messages[1].content
    assert bad.kind == "tool" and last.done and last.reward == 1.0
    assert first.tool_hits == 1 and bad.tool_hits == 0 and last.tool_hits == 0  # a hit: the result is the answer


def test_a_call_that_runs_but_computes_the_wrong_thing_is_no_hit() -> None:
    async def go():
        env = calculator_env()
        await env.reset(PROMPT)
        return await env.step(turn("<calc>48213*378</calc>"))

    async def unchecked():
        env = ToolEnv((), judge=calculator_reward)
        await env.reset(PROMPT)
        return await env.step(turn("#1"))

    step = run(go())
    assert step.tool_errors == 0 and step.tool_hits == 0
    assert run(unchecked()).tool_hits is None  # an environment without a result check cannot tell


def test_tool_env_failures_and_timeouts_are_observations() -> None:
    async def slow(args):
        await asyncio.sleep(5)
        return "late"

    async def boom(args):
        raise RuntimeError("bug")

    tools = (Tool("slow", "", {}, slow), Tool("boom", "", {}, boom))
    env = ToolEnv(tools, tool_timeout_s=0.05)

    async def go():
        await env.reset(PROMPT)
        calls = ParsedTurn(calls=(ToolCall("slow"), ToolCall("boom"), ToolCall("nope")))
        return await env.step(ModelTurn(0, "", calls)), await env.step(ModelTurn(1, "done", ParsedTurn()))

    result, answer = run(go())
    assert result.tool_errors == 3 and not result.done
    assert [m.content for m in result.messages] == [
        "error: slow timed out after 0.05s",
        "error: boom failed: RuntimeError: bug",
        "error: unknown tool 'nope' (tools: boom, slow)",
    ]
    assert answer.done and answer.reward is None  # no judge: the workflow's score callable decides


def test_tool_env_needs_the_question() -> None:
    with pytest.raises(ValueError, match="question"):
        run(ToolEnv(()).reset(Prompt("p", (1,))))


def test_python_tool_runs_in_a_thread_without_blocking_the_loop() -> None:
    seen = []

    def runner(code: str) -> str:
        seen.append(threading.current_thread() is threading.main_thread())
        time.sleep(0.3)
        return f"ran {len(code)} chars"

    env = python_env(runner)
    tags = {"python": ("python", "code")}

    async def go():
        reset = await env.reset(PROMPT)
        assert not reset.scores and reset.tags == tags
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        result = await env.step(turn("<python>print(1)</python>", tags=tags))
        task.cancel()
        empty = await env.step(turn("<python> </python>", tags=tags))
        return result, empty, ticks

    result, empty, ticks = run(go())
    assert result.messages == (Message("tool", "ran 8 chars"),) and seen == [False]
    assert ticks >= 10  # the event loop kept running while the tool worked
    assert empty.tool_errors == 1 and "non-empty" in empty.messages[0].content


class SyncGym:
    def __init__(self) -> None:
        self.actions: list[str] = []
        self.closed = False

    def reset(self, prompt: Prompt) -> str:
        return f"guess a number for {prompt.prompt_id}"

    def step(self, action: str) -> tuple[str, float, bool]:
        self.actions.append(action)
        return ("higher", 0.0, False) if len(self.actions) < 2 else ("right", 1.0, True)

    def close(self) -> None:
        self.closed = True


class AsyncGym(SyncGym):
    async def reset(self, prompt: Prompt) -> str:  # type: ignore[override]
        return "obs"

    async def step(self, action: str) -> tuple[str, float, bool]:  # type: ignore[override]
        return "next", 0.25, True


def test_gym_adapter_sync_and_async() -> None:
    gym = SyncGym()
    env = GymAdapter(gym, close=gym.close)

    async def go():
        reset = await env.reset(PROMPT)
        a = await env.step(turn("5"))
        b = await env.step(turn("7"))
        await env.close()
        c_env = GymAdapter(AsyncGym())
        return reset, a, b, await c_env.reset(PROMPT), await c_env.step(turn("x"))

    reset, a, b, c_reset, c = run(go())
    assert reset.messages == (Message("user", "guess a number for p"),) and reset.scores
    assert a.messages == (Message("user", "higher"),) and a.reward == 0.0 and not a.done and a.kind == "user"
    assert b.done and b.reward == 1.0 and b.messages == () and gym.actions == ["5", "7"] and gym.closed
    assert c_reset.messages == (Message("user", "obs"),) and c.done and c.reward == 0.25
