"""Simulated tool latency (``agent.tool_latency``): the lognormal's median and spread, streams seeded per
episode (reproducible, different across episodes), waits only on turns with tool calls, waits that
overlap across episodes (an episode waiting never holds up the others), and the step's start time on
the turn record."""

from __future__ import annotations

import asyncio
import math
import statistics
import time
import types

import pytest

import asyncrl.rollout.envs.latency as latency_module
from asyncrl.rollout.agent import AgentSettings, AgentWorkflow
from asyncrl.rollout.envs.calculator import calculator_env
from asyncrl.rollout.envs.latency import ToolLatency
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Completion, Prompt
from tests.rollout.chat_templates import tiny_tokenizer
from tests.rollout.scripted_engine import ScriptedEngine, Turn

PROMPT = Prompt("p0", (), answer="18272727", meta={"question": "What is 48213*379?"})


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tok"))


def ids(tok, text: str) -> tuple[int, ...]:
    return tuple(tok.encode(text, add_special_tokens=False)) + (tok.eos_token_id,)


async def never_score(prompt: Prompt, completion: Completion) -> tuple[float, str | None]:
    raise AssertionError("the environment scores its episodes")


def test_lognormal_waits_have_the_median_and_a_long_tail() -> None:
    latency = ToolLatency("lognormal", median_s=0.2, sigma=1.0, seed=7)
    rng = latency.stream("p0", 0)
    waits = [latency.draw(rng) for _ in range(4000)]
    assert statistics.median(waits) == pytest.approx(0.2, rel=0.08)
    p90 = sorted(waits)[int(0.9 * len(waits))]
    assert p90 == pytest.approx(0.2 * math.exp(1.2816), rel=0.12)  # the 90th percentile of a lognormal, sigma 1
    flat = ToolLatency("lognormal", median_s=0.3, sigma=0.0)
    assert {flat.draw(flat.stream("p0", 0)) for _ in range(5)} == {0.3}
    assert ToolLatency().draw(ToolLatency().stream("p0", 0)) == 0.0 and not ToolLatency().active


def test_streams_are_seeded_per_episode() -> None:
    latency = ToolLatency("lognormal", seed=1)

    def draws(prompt_id: str, episode: int, seed: ToolLatency = latency) -> list[float]:
        rng = seed.stream(prompt_id, episode)
        return [seed.draw(rng) for _ in range(3)]

    assert draws("p0", 0) == draws("p0", 0)  # the same episode draws the same waits, in any run
    assert draws("p0", 0) != draws("p0", 1) and draws("p0", 0) != draws("p1", 0)
    assert draws("p0", 0) != draws("p0", 0, ToolLatency("lognormal", seed=2))  # run.seed changes them


@pytest.mark.parametrize("bad", [{"dist": "gamma"}, {"median_s": 0.0}, {"sigma": -0.5}])
def test_bad_settings_are_refused(bad) -> None:
    with pytest.raises(ValueError):
        ToolLatency(**{"dist": "lognormal", **bad})


def test_episodes_wait_on_their_tools_concurrently(tok, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted, not timed: the waits the tools sleep, and how many sleep at once (all three: one after
    another, never more than one would), which a loaded machine does not change."""
    waits: list[float] = []
    sleeping, most = 0, 0

    async def counting_sleep(delay: float) -> None:
        nonlocal sleeping, most
        waits.append(delay)
        sleeping += 1
        most = max(most, sleeping)
        try:
            await asyncio.sleep(delay)
        finally:
            sleeping -= 1

    monkeypatch.setattr(latency_module, "asyncio", types.SimpleNamespace(sleep=counting_sleep))
    latency = ToolLatency("lognormal", median_s=0.5, sigma=0.0)
    call = [Turn(ids(tok, "<calc>48213*379</calc>")), Turn(ids(tok, "#18272727"))]
    answer = [Turn(ids(tok, "#18272727"))]
    engine = ScriptedEngine({100: call, 101: call, 102: call, 103: answer})
    workflow = AgentWorkflow(tok, calculator_env, AgentSettings(tool_format="tag", tool_latency=latency))

    async def play():
        group = await workflow(engine, PROMPT, SamplingParams(max_new_tokens=50, seed=100), 4, never_score, 0)
        return group, time.time()

    before = time.time()
    group, after = asyncio.run(asyncio.wait_for(play(), 30))
    assert group.rewards == (1.0, 1.0, 1.0, 1.0)
    assert waits == [0.5, 0.5, 0.5]  # one wait per tool turn, the median (sigma 0); none for the answer turn
    assert most == 3  # the three waits overlapped
    for traj in group.trajectories[:3]:
        waited = traj.turns[0]
        assert waited.tool_latency_s >= 0.5 and waited.tool_calls == ("calculator",)
        assert waited.tool_started_at is not None and before <= waited.tool_started_at <= after
    (answered,) = group.trajectories[3].turns  # an answer turn calls no tool: answered at once (no wait above)
    assert answered.tool_calls == ()


def test_each_episode_waits_its_own_draw(tok) -> None:
    latency = ToolLatency("lognormal", median_s=0.2, sigma=1.0, seed=0)
    draws = [latency.draw(latency.stream(PROMPT.prompt_id, i)) for i in range(2)]  # episodes 0 and 1 of the group
    assert draws[1] - draws[0] > 0.5  # seed 0 draws about 0.05 s and 0.64 s: far enough apart to tell
    call = [Turn(ids(tok, "<calc>2*3</calc>")), Turn(ids(tok, "#6"))]
    engine = ScriptedEngine({5: call, 6: call})
    workflow = AgentWorkflow(tok, calculator_env, AgentSettings(tool_format="tag", tool_latency=latency))
    group = asyncio.run(workflow(engine, PROMPT, SamplingParams(max_new_tokens=50, seed=5), 2, never_score, 0))
    short, long = (traj.turns[0].tool_latency_s for traj in group.trajectories)
    assert draws[0] <= short < draws[1] <= long  # a sleep never ends early; the short one did not wait the long draw
