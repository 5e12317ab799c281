"""The multi-turn workflow on a scripted engine: groups, seeds, rewards (the environment's or the
score callable's), the malformed-call penalty, episodes waiting on a slow tool while others decode,
and the environment always closed."""

from __future__ import annotations

import asyncio
import time

import pytest

from asyncrl.rollout.agent import AgentSettings, AgentWorkflow, run_agent_episode
from asyncrl.rollout.api import RolloutEngine
from asyncrl.rollout.chat import ChatRenderer
from asyncrl.rollout.envs.base import EnvReset, Message, ModelTurn, StepResult, Tool, ToolEnv
from asyncrl.rollout.envs.calculator import calculator_env
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Completion, Prompt
from tests.rollout.chat_templates import tiny_tokenizer
from tests.rollout.scripted_engine import ScriptedEngine, Turn, exactness

PROMPT = Prompt("p0", (), answer="18272727", meta={"question": "What is 48213*379?"})


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tok"))


def ids(tok, text: str) -> tuple[int, ...]:
    return tuple(tok.encode(text, add_special_tokens=False)) + (tok.eos_token_id,)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


async def never_score(prompt: Prompt, completion: Completion) -> tuple[float, str | None]:
    raise AssertionError("the environment scores its episodes")


def test_group_of_episodes_with_their_own_seeds(tok) -> None:
    right = [Turn(ids(tok, "<calc>48213*379</calc>")), Turn(ids(tok, "#18272727"))]
    wrong = [Turn(ids(tok, "#5"))]
    engine = ScriptedEngine({100: right, 101: wrong, 102: right})
    assert isinstance(engine, RolloutEngine)
    done: list[int] = []
    workflow = AgentWorkflow(tok, calculator_env, AgentSettings(tool_format="tag"))
    sampling = SamplingParams(max_new_tokens=50, seed=100)
    group = run(workflow(engine, PROMPT, sampling, 3, never_score, start_version=4, on_sample_done=done.append))
    assert group.rewards == (1.0, 0.0, 1.0) and sorted(done) == [0, 1, 2] and group.start_version == 4
    assert [len(t.turns) for t in group.trajectories] == [2, 1, 2]
    assert group.reward_failures == (None, None, None)
    for i, (traj, comp) in enumerate(zip(group.trajectories, group.completions, strict=True)):
        assert comp == traj.to_completion()
        assert exactness(traj, [c for c in engine.calls if c.sampling.seed == 100 + i])["mismatches"] == 0
    opening = tok.decode(list(group.trajectories[0].prompt_ids))
    assert opening == "Q:What is 48213*379?\nA:"  # the environment's opening through the template


def test_score_callable_when_the_environment_does_not_score(tok) -> None:
    async def echo(args):
        return args["expression"]

    env = lambda: ToolEnv((Tool("calculator", "", {}, echo, tag="calc", arg="expression"),))  # noqa: E731
    engine = ScriptedEngine({0: [Turn(ids(tok, "<calc>7</calc>")), Turn(ids(tok, "<calc>8")), Turn(ids(tok, "#7"))]})
    seen: list[Completion] = []

    async def score(prompt: Prompt, completion: Completion) -> tuple[float, str | None]:
        seen.append(completion)
        return 1.0, "verifier timed out"

    settings = AgentSettings(tool_format="tag", malformed_penalty=0.25)
    group = run(
        AgentWorkflow(tok, env, settings)(engine, PROMPT, SamplingParams(max_new_tokens=64, seed=0), 1, score, 0)
    )
    (traj,) = group.trajectories
    assert traj.env_reward is None and seen == [traj.to_completion()]
    assert group.rewards == (0.75,) and group.reward_failures == ("verifier timed out",)  # one malformed call
    assert seen[0].loss_mask == traj.loss_mask and 0 in seen[0].loss_mask


class _OpeningFromPrompt:
    """An environment with no opening messages: the prompt's own ids open the episode."""

    closed = 0

    async def reset(self, prompt: Prompt) -> EnvReset:
        return EnvReset(scores=True)

    async def step(self, turn: ModelTurn) -> StepResult:
        if turn.index == 1:
            raise RuntimeError("environment crashed")
        if "#" in turn.text:
            return StepResult(done=True, reward=0.5)
        return StepResult(messages=(Message("user", "go on"),), kind="user")

    async def close(self) -> None:
        type(self).closed += 1


def test_opening_from_the_prompt_and_close_on_every_path(tok) -> None:
    prompt = Prompt("p1", tuple(tok.encode("Q:1+1\nA:")), answer="2", meta={"question": "1+1"})
    engine = ScriptedEngine({0: [Turn(ids(tok, "#2"))], 1: [Turn(ids(tok, "x")), Turn(ids(tok, "y"))]})
    renderer = ChatRenderer(tok)

    async def episode(seed: int):
        env = _OpeningFromPrompt()
        try:
            return await run_agent_episode(
                engine, env, renderer, prompt, SamplingParams(max_new_tokens=64, seed=seed), AgentSettings()
            )
        finally:
            await env.close()

    traj = run(episode(0))
    assert traj.prompt_ids == prompt.token_ids and traj.env_reward == 0.5 and traj.end == "answer"
    workflow = AgentWorkflow(tok, _OpeningFromPrompt, AgentSettings(max_turns=3))
    _OpeningFromPrompt.closed = 0
    with pytest.raises(RuntimeError, match="crashed"):
        run(
            workflow(
                ScriptedEngine({5: [Turn(ids(tok, "a")), Turn(ids(tok, "b"))]}),
                prompt,
                SamplingParams(max_new_tokens=64, seed=5),
                1,
                never_score,
                0,
            )
        )
    assert _OpeningFromPrompt.closed == 1


def test_a_slow_tool_does_not_hold_up_other_episodes(tok) -> None:
    """The slow tool returns only once the other episode has finished (or after a 20 s hang guard): the fast
    episode ends while the tool waits, told by the order of events, not by a wall clock."""
    finished: dict[str, float] = {}
    fast_done = asyncio.Event()
    seen_by_the_tool: list[bool] = []

    async def slow(args):
        await asyncio.sleep(0.5)
        try:
            await asyncio.wait_for(fast_done.wait(), 20)
        except asyncio.TimeoutError:  # (TimeoutError from 3.11 on)
            pass
        seen_by_the_tool.append(fast_done.is_set())
        return "1"

    def make_env():
        return ToolEnv((Tool("slow", "", {}, slow, tag="slow", arg="x"),), judge=lambda p, t: 1.0)

    slow_turns = [Turn(ids(tok, "<slow>1</slow>")), Turn(ids(tok, "#1"))]
    fast_turns = [Turn(ids(tok, f"step {i}")) for i in range(3)]

    class Gym(ToolEnv):
        async def step(self, turn: ModelTurn) -> StepResult:
            if turn.index == 2:
                finished["fast"] = time.monotonic()
                fast_done.set()
                return StepResult(done=True, reward=1.0)
            return StepResult(messages=(), kind="user", reward=0.0)

    engine = ScriptedEngine({0: slow_turns, 1: fast_turns})
    renderer = ChatRenderer(tok)
    settings = AgentSettings(tool_format="tag", max_turns=4)

    async def both():
        start = time.monotonic()
        slow_ep = run_agent_episode(
            engine, make_env(), renderer, PROMPT, SamplingParams(max_new_tokens=64, seed=0), settings
        )
        fast_ep = run_agent_episode(
            engine,
            Gym((), judge=lambda p, t: 0.0),
            renderer,
            PROMPT,
            SamplingParams(max_new_tokens=64, seed=1),
            settings,
        )
        a, b = await asyncio.gather(slow_ep, fast_ep)
        return start, a, b, time.monotonic()

    start, a, b, end = run(both())
    assert a.turns[0].tool_latency_s >= 0.5 and a.env_reward == 1.0 and b.env_reward == 1.0
    assert seen_by_the_tool == [True]  # the fast episode ended while the tool waited
    assert start < finished["fast"] < end


def test_stop_at_a_multi_token_close_tag_is_refused(tok) -> None:
    engine = ScriptedEngine({0: [Turn(ids(tok, "#1"))]})
    settings = AgentSettings(tool_format="tag", stop_at_tool_close=True)
    with pytest.raises(ValueError, match="not one"):
        run(
            run_agent_episode(
                engine, calculator_env(), ChatRenderer(tok), PROMPT, SamplingParams(max_new_tokens=64, seed=0), settings
            )
        )
    with pytest.raises(ValueError):
        AgentSettings(max_turns=0)
