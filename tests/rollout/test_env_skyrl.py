"""skyrl-gym environments (``agent.env=skyrl:<id or pkg.module:Class>``) on real objects of skyrl-gym's own
registry: ``gsm8k`` (one step, scored by its rule) and ``gsm8k_multi_turn`` (turn-level format rewards, a user turn
asking again after a wrong answer), made with SkyRL's ``extras`` (``reward_spec.ground_truth``), played directly
and through the project's multi-turn workflow (token-exact). Ran against skyrl-gym 0.4.0 (asserted below)."""

from __future__ import annotations

import asyncio
from importlib.metadata import version

import pytest

skyrl_gym = pytest.importorskip("skyrl_gym")

from asyncrl.rollout.agent import AgentSettings, AgentWorkflow  # noqa: E402
from asyncrl.rollout.envs.base import EnvOptions, ModelTurn  # noqa: E402
from asyncrl.rollout.envs.registry import env_maker  # noqa: E402
from asyncrl.rollout.envs.skyrl import SkyRLEnv  # noqa: E402
from asyncrl.rollout.sampling import SamplingParams  # noqa: E402
from asyncrl.rollout.tools import parse_tool_calls  # noqa: E402
from asyncrl.types import Completion, Prompt  # noqa: E402
from tests.rollout.chat_templates import tiny_tokenizer  # noqa: E402
from tests.rollout.scripted_engine import ScriptedEngine, Turn, exactness  # noqa: E402

SKYRL_GYM = "0.4.0"
PROMPT = Prompt("q0", (), answer="18", meta={"question": "Janet has 3 ducks ... how many eggs?"})


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def turn(text: str, index: int = 0) -> ModelTurn:
    return ModelTurn(index, text, parse_tool_calls("hermes", text, {}))


def test_the_version_and_a_one_step_gsm8k_env() -> None:
    assert version("skyrl-gym") == SKYRL_GYM
    env = env_maker("skyrl:gsm8k", EnvOptions())()
    assert isinstance(env, SkyRLEnv)

    async def play(text: str):
        reset = await env.reset(PROMPT)
        made = type(env.env).__name__  # type: ignore[attr-defined]
        step = await env.step(turn(text))
        await env.close()
        return reset, made, step

    reset, made, right = run(play("3 * 6 = 18\n#### 18"))
    assert made == "GSM8kEnv" and [(m.role, m.content) for m in reset.messages] == [("user", PROMPT.meta["question"])]
    assert reset.scores and right.done and right.reward == 1.0 and not right.messages
    assert run(play("#### 17"))[2].reward == 0.0


def test_the_multi_turn_env_asks_again_and_rewards_each_turn() -> None:
    env = env_maker("skyrl:gsm8k_multi_turn", EnvOptions())()

    async def play():
        await env.reset(PROMPT)
        steps = [await env.step(turn("#### 17", 0)), await env.step(turn("#### 18", 1))]
        await env.close()
        return steps

    wrong, right = run(play())
    assert not wrong.done and wrong.kind == "user" and "#### ANSWER" in wrong.messages[0].content
    assert wrong.reward == pytest.approx(0.2 / 5)  # the format score per turn (max_turns 5)
    assert right.done and right.reward == 1.0


def test_unknown_ids_and_classes_are_refused_in_one_line() -> None:
    for spec, fragment in {
        "skyrl:": "needs a skyrl-gym id",
        "skyrl:nosuch": "is not a skyrl-gym id (registered: aime,",
        "skyrl:nosuchpkg.mod:Env": "cannot load it (ModuleNotFoundError",
    }.items():
        with pytest.raises(ValueError, match="^agent.env=skyrl:") as e:
            env_maker(spec, EnvOptions())
        assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_group_of_skyrl_episodes_through_the_workflow(tmp_path) -> None:
    tok = tiny_tokenizer(tmp_path / "tok")

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tok.encode(text, add_special_tokens=False)) + (tok.eos_token_id,)

    engine = ScriptedEngine({10: [Turn(ids("#### 17")), Turn(ids("#### 18"))], 11: [Turn(ids("#### 18"))]})
    workflow = AgentWorkflow(tok, env_maker("skyrl:gsm8k_multi_turn", EnvOptions()), AgentSettings(max_tokens=300))

    def never(prompt: Prompt, completion: Completion):
        raise AssertionError("the skyrl-gym environment scores its episodes")

    group = run(workflow(engine, PROMPT, SamplingParams(max_new_tokens=30, seed=10), 2, never, start_version=0))
    assert group.rewards[0] == pytest.approx(1.0 + 0.2 / 5) and group.rewards[1] == 1.0
    assert [len(t.turns) for t in group.trajectories] == [2, 1]
    assert [t.end for t in group.trajectories] == ["answer", "answer"]
    for i, traj in enumerate(group.trajectories):
        assert exactness(traj, [c for c in engine.calls if c.sampling.seed == 10 + i])["mismatches"] == 0


def test_the_config_takes_the_prefixed_adapters() -> None:
    from asyncrl.config import load_config

    for env in ("skyrl:gsm8k", "skyrl:mypkg.envs:MyEnv", "openenv:http://127.0.0.1:8000#message"):
        assert load_config(None, ["rollout.workflow=agent", f"agent.env={env}"]).agent.env == env
