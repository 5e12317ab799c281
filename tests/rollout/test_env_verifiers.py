"""verifiers environments (``task.name=verifiers`` + ``agent.env=verifiers``) on real verifiers objects: tasksets
written with verifiers' own classes (``tests/rollout/vf_tasksets``: a single-turn ``vf.Taskset`` with ``@vf.reward``
functions, and a tool-calling one whose ``vf.Toolset`` exposes an ``@vf.tool`` as an MCP tool), loaded by
verifiers' loader, played through the project's multi-turn workflow (token-exact) and scored by ``vf.Task.score``.
Ran against verifiers 0.4.0 (asserted below)."""

from __future__ import annotations

import asyncio
import json
from importlib.metadata import version
from pathlib import Path

import pytest

vf = pytest.importorskip("verifiers.v1")

from asyncrl.config import ConfigError, load_config  # noqa: E402
from asyncrl.data.verifiers import verifiers_prompts  # noqa: E402
from asyncrl.rollout.agent import AgentSettings, AgentWorkflow  # noqa: E402
from asyncrl.rollout.envs.base import EnvOptions, ModelTurn  # noqa: E402
from asyncrl.rollout.envs.registry import env_maker  # noqa: E402
from asyncrl.rollout.envs.verifiers import VerifiersEnv  # noqa: E402
from asyncrl.rollout.sampling import SamplingParams  # noqa: E402
from asyncrl.rollout.tools import parse_tool_calls  # noqa: E402
from asyncrl.types import Completion, Prompt  # noqa: E402
from tests.rollout.chat_templates import tiny_tokenizer  # noqa: E402
from tests.rollout.scripted_engine import ScriptedEngine, Turn, exactness  # noqa: E402

VERIFIERS = "0.4.0"
TASKSETS = Path(__file__).parent / "vf_tasksets"


@pytest.fixture(autouse=True)
def tasksets_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TASKSETS))


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def prompts(taskset: str, train: int, held: int) -> tuple[list[Prompt], list[Prompt]]:
    return verifiers_prompts(taskset, 7, train, held, lambda q: (1, 2, 3))


def turn(text: str, index: int = 0) -> ModelTurn:
    return ModelTurn(index, text, parse_tool_calls("hermes", text, {}))


def call(name: str, **arguments: object) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def never(prompt: Prompt, completion: Completion):
    raise AssertionError("the verifiers task scores its episodes")


def test_the_version_and_the_tasksets_prompts() -> None:
    assert version("verifiers") == VERIFIERS
    train, held = prompts("vf_sums", 40, 8)
    assert (len(train), len(held)) == (40, 8)
    assert not {p.prompt_id for p in train} & {p.prompt_id for p in held}
    p = held[0]
    assert p.meta["verifiers"]["taskset"] == "vf_sums" and p.meta["problem_kind"] == "add"
    a, b = (int(x) for x in p.meta["question"].removesuffix("=?").split("+"))
    assert p.answer == str(a + b) and p.meta["verifiers"]["task"]["answer"] == p.answer
    assert prompts("vf_sums", 40, 8)[1] == held  # seeded
    with pytest.raises(ConfigError, match=r"^task.datasets=no_such_taskset: not a verifiers taskset") as e:
        prompts("no_such_taskset", 4, 2)
    assert "\n" not in str(e.value)


def test_a_single_turn_task_scored_by_its_own_rewards() -> None:
    _, held = prompts("vf_sums", 8, 4)
    env = env_maker("verifiers", EnvOptions())()
    assert isinstance(env, VerifiersEnv)
    p = held[0]

    async def play(text: str):
        reset = await env.reset(p)
        step = await env.step(turn(text))
        trace = env.trace()
        await env.close()
        return reset, step, trace

    reset, right, trace = run(play(f"so #{p.answer}"))
    assert [(m.role, m.content) for m in reset.messages] == [("user", p.meta["question"])]
    assert reset.scores and not reset.tools
    assert right.done and right.reward == pytest.approx(1.5)  # correct (1) + has_hash (weight 0.5)
    assert isinstance(trace, vf.Trace) and trace.last_reply == f"so #{p.answer}" and trace.num_turns == 1
    wrong = str(int(p.answer) + 1)
    assert run(play(f"#{wrong}"))[1].reward == pytest.approx(0.5)
    assert run(play(p.answer))[1].reward == pytest.approx(1.0)


def test_a_tool_task_runs_its_mcp_tool_and_scores_the_conversation() -> None:
    _, held = prompts("vf_tools", 3, 2)
    p = held[0]
    a, b = (int(x) for x in p.meta["question"].split()[2].rstrip("?").split("*"))
    env = env_maker("verifiers", EnvOptions(tool_timeout_s=5.0))()

    async def play(*texts: str):
        reset = await env.reset(p)
        steps = [await env.step(turn(t, i)) for i, t in enumerate(texts)]
        await env.close()
        return reset, steps

    reset, (used, bad, unknown, answer) = run(
        play(call("arith_mul", a=a, b=b), call("arith_mul", a="x", b=1), call("nope"), f"It is {a * b}.")
    )
    assert [m.role for m in reset.messages] == ["system", "user"]
    (schema,) = reset.tools
    assert schema["function"]["name"] == "arith_mul" and schema["function"]["description"] == "Multiply two integers."
    assert schema["function"]["parameters"]["properties"]["a"]["type"] == "integer"
    assert [m.content for m in used.messages] == [str(a * b)] and not used.done and used.tool_errors == 0
    assert (
        bad.tool_errors == 1
        and bad.messages[0].content.startswith("error: ")
        and "validation" in bad.messages[0].content
    )
    assert unknown.tool_errors == 1 and "unknown tool 'nope'" in unknown.messages[0].content
    assert answer.done and answer.reward == 1.0
    # the same answer without the tool's result in the conversation is not rewarded (the task reads the trace)
    assert run(play(f"It is {a * b}."))[1][0].reward == 0.0


def test_a_group_of_verifiers_tool_episodes_through_the_workflow(tmp_path) -> None:
    tok = tiny_tokenizer(tmp_path / "tok")
    _, held = prompts("vf_tools", 3, 2)
    p = held[1]
    a, b = (int(x) for x in p.meta["question"].split()[2].rstrip("?").split("*"))

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tok.encode(text, add_special_tokens=False)) + (tok.eos_token_id,)

    engine = ScriptedEngine(
        {
            10: [Turn(ids(call("arith_mul", a=a, b=b))), Turn(ids(f"#{a * b}"))],
            11: [Turn(ids(f"#{a * b + 1}"))],
        }
    )
    workflow = AgentWorkflow(tok, env_maker("verifiers", EnvOptions()), AgentSettings(max_turns=3, max_tokens=600))
    group = run(workflow(engine, p, SamplingParams(max_new_tokens=200, seed=10), 2, never, start_version=0))
    assert group.rewards == (1.0, 0.0)
    assert [len(t.turns) for t in group.trajectories] == [2, 1]
    assert group.trajectories[0].turns[0].tool_calls == ("arith_mul",)
    for i, traj in enumerate(group.trajectories):
        assert exactness(traj, [c for c in engine.calls if c.sampling.seed == 10 + i])["mismatches"] == 0


def test_config_refuses_a_verifiers_task_without_its_environment() -> None:
    with pytest.raises(ConfigError, match=r"^task.name=verifiers is played and scored by its tasks") as e:
        load_config(None, ["task.name=verifiers", "task.datasets=vf_sums"])
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"^task.name=verifiers needs task.datasets"):
        load_config(None, ["task.name=verifiers", "rollout.workflow=agent", "agent.env=verifiers"])
    with pytest.raises(ConfigError, match=r"^agent.env=verifiers plays task.name=verifiers prompts"):
        load_config(None, ["rollout.workflow=agent", "agent.env=verifiers"])
    cfg = load_config(
        None, ["task.name=verifiers", "task.datasets=vf_sums", "rollout.workflow=agent", "agent.env=verifiers"]
    )
    assert cfg.task.datasets == "vf_sums"
