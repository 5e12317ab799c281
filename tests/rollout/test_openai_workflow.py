"""``rollout.openai_workflow``: G sessions of an ``openai``-client agent per prompt on a scripted engine:
each session's trajectory exact, the reward from the agent's return, its ``/end`` or the verifier; an
agent that raises after a call is scored on what it did, one that made no call fails the group; the
workflow is built from the config (``rollout.workflow=openai_agent``, ``agent.entrypoint``); the per-call
cap ``max_turn_tokens`` lowers an agent's larger ``max_tokens``."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest

from asyncrl.config import load_config
from asyncrl.launch.stages import build_workflow
from asyncrl.rollout.openai_workflow import DoorSettings, OpenAIAgentWorkflow
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Prompt
from tests.rollout.chat_templates import qwen_tokenizer
from tests.rollout.scripted_engine import ScriptedEngine, Turn, exactness

openai = pytest.importorskip("openai")
PROMPT = Prompt("p7", (1, 2), "3", {"question": "1+2?"})


@pytest.fixture(scope="module")
def tok():
    return qwen_tokenizer()


def _two_turns(base_url: str, api_key: str, task: dict) -> float | None:
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": task["question"]}]
    first = client.chat.completions.create(model="m", messages=messages).choices[0].message
    messages += [first, {"role": "user", "content": "sure?"}]
    second = client.chat.completions.create(model="m", messages=messages).choices[0].message
    match task["meta"]["mode"]:
        case "return":
            return 1.0 if "#3" in (second.content or "") else 0.0
        case "end":  # report through the door instead
            body = json.dumps({"reward": 0.25}).encode()
            auth = {"Authorization": f"Bearer {api_key}"}
            req = urllib.request.Request(base_url.removesuffix("/v1") + "/end", data=body, headers=auth, method="POST")
            urllib.request.urlopen(req, timeout=30).read()
            return None
        case "raise":
            raise RuntimeError("the agent's own bug")
    return None


def _run(tok, agent, mode: str, group: int = 2):
    ids = lambda text: tuple(tok.encode(text, add_special_tokens=False)) + (tok.eos_token_id,)  # noqa: E731
    scripts = {100 + i: [Turn(ids("#4")), Turn(ids("#3" if i == 0 else "#5"))] for i in range(group)}
    engine = ScriptedEngine(scripts)
    workflow = OpenAIAgentWorkflow(tok, agent, end_of_turn_ids=(tok.eos_token_id,))
    scored: list[str] = []

    async def score(prompt, completion):
        scored.append(tok.decode(list(completion.output_ids)))
        return 0.5, None

    prompt = Prompt(PROMPT.prompt_id, PROMPT.token_ids, PROMPT.answer, {**PROMPT.meta, "mode": mode})
    sampling = SamplingParams(max_new_tokens=16, seed=100)
    group_ = asyncio.run(asyncio.wait_for(workflow(engine, prompt, sampling, group, score, 3), 60))
    return group_, engine, scored


def test_each_session_is_a_trajectory_with_the_agents_reward(tok) -> None:
    group, engine, scored = _run(tok, _two_turns, "return")
    assert group.rewards == (1.0, 0.0) and not scored and group.start_version == 3
    for i, (traj, completion) in enumerate(zip(group.trajectories, group.completions, strict=True)):
        report = exactness(traj, [c for c in engine.calls if c.sampling.seed == 100 + i])  # episode i: seed + i
        assert (
            report["mismatches"] == 0 and report["mask_errors"] == 0 and report["engine_tokens"] == sum(traj.loss_mask)
        ), report
        assert len(traj.turns) == 2 and traj.end == "answer"
        assert completion.loss_mask == traj.loss_mask


def test_the_reward_can_come_from_end_or_the_verifier(tok) -> None:
    assert _run(tok, _two_turns, "end")[0].rewards == (0.25, 0.25)
    group, _, scored = _run(tok, _two_turns, "verifier")
    assert group.rewards == (0.5, 0.5) and len(scored) == 2 and "sure?" in scored[0]  # the whole session
    group, _, _ = _run(tok, _two_turns, "raise")  # scored on the calls it made
    assert group.rewards == (0.5, 0.5) and all(len(t.turns) == 2 for t in group.trajectories)


def test_an_agent_that_makes_no_call_fails_the_group(tok) -> None:
    def idle(base_url: str, api_key: str, task: dict) -> None:
        raise ValueError("no model call")

    with pytest.raises(RuntimeError, match="made no call"):
        _run(tok, idle, "x")

    def wrong(base_url: str, api_key: str, task: dict) -> str:
        _two_turns(base_url, api_key, {**task, "meta": {"mode": "verifier"}})
        return "great"

    with pytest.raises(TypeError, match="return a reward"):
        _run(tok, wrong, "x", group=1)


def test_the_workflow_is_built_from_the_config(tok) -> None:
    entry = "agent.entrypoint=tests.rollout.test_openai_workflow:_two_turns"
    cfg = load_config(None, ["rollout.workflow=openai_agent", entry, "agent.tool_format=json", "agent.max_tokens=77"])
    workflow = build_workflow(cfg, tok, (tok.eos_token_id,))
    assert isinstance(workflow, OpenAIAgentWorkflow) and workflow.entrypoint is _two_turns
    assert workflow.settings.tool_format == "json" and workflow.settings.max_tokens == 77


async def _async_agent(base_url: str, api_key: str, task: dict) -> float:
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        reply = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": task["question"]}]
        )
    return 1.0 if reply.choices[0].message.content == "#4" else 0.0


def test_an_async_agent_runs_on_the_event_loop(tok) -> None:
    group, engine, _ = _run(tok, _async_agent, "return")
    assert group.rewards == (1.0, 1.0) and all(len(t.turns) == 1 for t in group.trajectories)
    assert len(engine.calls) == 2


def _greedy_agent(base_url: str, api_key: str, task: dict) -> None:
    """Asks for far more tokens than the workflow's per-call cap, then for fewer."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list = [{"role": "user", "content": task["question"]}]
    first = client.chat.completions.create(model="gpt-4o", messages=messages, max_tokens=64).choices[0]
    assert first.finish_reason == "length"
    messages += [first.message, {"role": "user", "content": "go on"}]
    client.chat.completions.create(model="any-name", messages=messages, max_tokens=3)


def test_max_turn_tokens_caps_an_agents_max_tokens(tok) -> None:
    """``agent.max_turn_tokens`` is the per-call cap: an agent's ``max_tokens=64`` is lowered to 8, its
    ``max_tokens=3`` kept; the workflow's door answers to whatever model name the agent uses."""
    long_turn = tuple(tok.encode("one two three four five six seven eight nine ten eleven", add_special_tokens=False))
    engine = ScriptedEngine({100: [Turn(long_turn), Turn(long_turn)]})
    workflow = OpenAIAgentWorkflow(
        tok, _greedy_agent, DoorSettings(max_turn_tokens=8), end_of_turn_ids=(tok.eos_token_id,)
    )

    async def score(prompt, completion):
        return 0.0, None

    sampling = SamplingParams(max_new_tokens=16, seed=100)
    group = asyncio.run(asyncio.wait_for(workflow(engine, PROMPT, sampling, 1, score, 0), 60))
    assert [c.sampling.max_new_tokens for c in engine.calls] == [8, 3]
    (traj,) = group.trajectories
    assert [t.model_tokens for t in traj.turns] == [8, 3]
