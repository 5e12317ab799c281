"""The environment registry (``agent.env``): the project's own environments as entry points, a third party's
found from a distribution's metadata without editing the project, unknown names refused in one line; and
Gymnasium text environments (``agent.env=gym:...``) on real ``gymnasium.Env`` objects, played by the
multi-turn workflow. Ran against gymnasium 1.4.0 (the version is asserted below)."""

from __future__ import annotations

import asyncio
import string
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path

import gymnasium
import pytest
import tomllib
from gymnasium import spaces

from asyncrl.config import ConfigError, load_config
from asyncrl.rollout.agent import AgentSettings, AgentWorkflow
from asyncrl.rollout.envs.base import EnvOptions, ToolEnv
from asyncrl.rollout.envs.gym import GymAdapter, episode_seed
from asyncrl.rollout.envs.registry import GROUP, env_maker, registered
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Completion, Prompt
from tests.rollout.chat_templates import tiny_tokenizer
from tests.rollout.scripted_engine import ScriptedEngine, Turn, exactness

GYMNASIUM = "1.4.0"
ROOT = Path(__file__).resolve().parents[2]
PROMPT = Prompt("p0", (), answer="", meta={"question": "Guess my digit."})


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


class GuessDigit(gymnasium.Env):
    """A Gymnasium text game: guess the secret digit in three tries ("higher"/"lower" after each miss)."""

    def __init__(self) -> None:
        self.observation_space = spaces.Text(64, charset=string.printable)
        self.action_space = spaces.Text(64, charset=string.printable)
        self.secret = 0
        self.tries = 0
        self.closed = False

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        self.secret, self.tries = int(self.np_random.integers(10)), 0
        question = (options or {}).get("question") or "Guess a digit."
        return f"{question} 0-9?", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.tries += 1
        digits = [int(c) for c in action if c.isdigit()]
        if digits and digits[-1] == self.secret:
            return "right", 1.0, True, False, {}
        hint = "higher" if digits and digits[-1] < self.secret else "lower"
        return hint, 0.0, False, self.tries >= 3, {}

    def close(self) -> None:
        self.closed = True


def secret_of(prompt_id: str, run_seed: int = 0) -> int:
    env = GuessDigit()
    env.reset(seed=episode_seed(run_seed, prompt_id))
    return env.secret


def test_the_projects_environments_are_entry_points_of_its_pyproject() -> None:
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][GROUP]
    assert table == {
        "calculator": "asyncrl.rollout.envs.calculator:make",
        "python": "asyncrl.rollout.envs.python:make",
        "verifiers": "asyncrl.rollout.envs.verifiers:make",
    }
    assert {k: registered()[k] for k in table} == table  # the installed metadata holds them (pip install -e .)
    assert isinstance(env_maker("calculator", EnvOptions(tool_timeout_s=2.0))(), ToolEnv)
    python = env_maker("python", EnvOptions(code_runner=lambda code: "ran"))()
    assert set(python.tools) == {"python"}  # type: ignore[attr-defined]


def test_a_third_partys_distribution_is_found_without_editing_the_project(tmp_path, monkeypatch) -> None:
    site = tmp_path / "site"
    (site / "acme_envs_fake").mkdir(parents=True)
    (site / "acme_envs_fake" / "__init__.py").write_text(
        textwrap.dedent("""
        from asyncrl.rollout.envs.gym import GymAdapter

        class Echo:
            def reset(self, prompt):
                return "say " + prompt.meta["question"]

            def step(self, action):
                return action, float(action == "hi"), True

        def make(options):
            return GymAdapter(Echo())

        def not_an_env(options):
            return Echo()
    """)
    )
    info = site / "acme_envs_fake-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-envs-fake\nVersion: 1.0\n")
    entries = "acme-echo = acme_envs_fake:make\nacme-bad = acme_envs_fake:not_an_env\n"
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n{entries}")
    assert "acme-echo" not in registered()
    monkeypatch.syspath_prepend(str(site))
    try:
        assert registered()["acme-echo"] == "acme_envs_fake:make"
        env = env_maker("acme-echo", EnvOptions())()
        assert isinstance(env, GymAdapter)
        reset = run(env.reset(Prompt("p", (), "", {"question": "hi"})))
        assert reset.messages[0].content == "say hi" and reset.scores
        with pytest.raises(ValueError, match=r"^agent.env=acme-bad: the maker returned Echo, not an Environment") as e:
            env_maker("acme-bad", EnvOptions())
        assert "\n" not in str(e.value)
        # the same maker named directly, unregistered
        assert isinstance(env_maker("acme_envs_fake:make", EnvOptions())(), GymAdapter)
    finally:
        sys.modules.pop("acme_envs_fake", None)


def test_unknown_names_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError) as e:
        env_maker("calculater", EnvOptions())
    message = str(e.value)
    assert message.startswith("agent.env='calculater' is not a registered environment; registered: calculator,")
    assert "python" in message and "gym:<id or pkg.module:Class>" in message and "\n" not in message
    for spec, fragment in {
        "nosuchpkg.mod:make": "cannot load nosuchpkg.mod:make (ModuleNotFoundError",
        "asyncrl.rollout.envs.calculator:nope": "AttributeError",
        "gym:": "needs a Gymnasium id",
        "gym:NoSuchEnv-v0": "agent.env=gym:NoSuchEnv-v0: NameNotFound",
        "gym:asyncrl.rollout.envs.calculator:calculator_tool": "made a Tool, not a gymnasium.Env",
    }.items():
        with pytest.raises(ValueError, match="^agent.env=") as e:
            env_maker(spec, EnvOptions())
        assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(ConfigError, match="^agent.env must be a registered environment name") as c:
        load_config(None, ["agent.env=not a name"])
    assert "\n" not in str(c.value)
    assert load_config(None, ["agent.env=gym:tests.rollout.test_env_registry:GuessDigit"]).agent.env.startswith("gym:")


def test_gymnasium_text_env_by_class_and_by_id() -> None:
    assert version("gymnasium") == GYMNASIUM == gymnasium.__version__
    by_class = env_maker("gym:tests.rollout.test_env_registry:GuessDigit", EnvOptions(seed=3))()
    gymnasium.register(id="AsyncrlGuessDigit-v0", entry_point=GuessDigit)
    try:
        by_id = env_maker("gym:AsyncrlGuessDigit-v0", EnvOptions(seed=3))()
    finally:
        gymnasium.registry.pop("AsyncrlGuessDigit-v0")
    secret = secret_of("p0", 3)
    for env in (by_class, by_id):
        assert isinstance(env, GymAdapter) and isinstance(env.gym.env.unwrapped, GuessDigit)  # type: ignore[attr-defined]

        async def play(env=env):
            reset = await env.reset(PROMPT)
            miss = await env.step(_turn(str((secret + 1) % 10)))
            hit = await env.step(_turn(f"it is {secret}"))
            await env.close()
            return reset, miss, hit

        reset, miss, hit = run(play())
        assert reset.messages[0].content == "Guess my digit. 0-9?" and reset.scores
        assert miss.messages[0].content in ("higher", "lower") and not miss.done and miss.reward == 0.0
        assert hit.done and hit.reward == 1.0 and env.gym.env.unwrapped.closed  # type: ignore[attr-defined]


def _turn(text: str):
    from asyncrl.rollout.envs.base import ModelTurn
    from asyncrl.rollout.tools import parse_tool_calls

    return ModelTurn(0, text, parse_tool_calls("hermes", text, {}))


def test_a_group_of_gymnasium_episodes_through_the_workflow(tmp_path) -> None:
    tok = tiny_tokenizer(tmp_path / "tok")
    secret = secret_of("p0")

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tok.encode(text, add_special_tokens=False)) + (tok.eos_token_id,)

    miss = str((secret + 1) % 10)
    engine = ScriptedEngine(
        {
            10: [Turn(ids(miss)), Turn(ids(str(secret)))],
            11: [Turn(ids(miss)), Turn(ids(miss)), Turn(ids(miss))],
        }
    )
    make = env_maker("gym:tests.rollout.test_env_registry:GuessDigit", EnvOptions(seed=0))
    workflow = AgentWorkflow(tok, make, AgentSettings(max_turns=4, max_tokens=200))

    async def never(prompt: Prompt, completion: Completion) -> tuple[float, str | None]:
        raise AssertionError("the environment scores its episodes")

    group = run(workflow(engine, PROMPT, SamplingParams(max_new_tokens=20, seed=10), 2, never, start_version=0))
    assert group.rewards == (1.0, 0.0)
    assert [len(t.turns) for t in group.trajectories] == [2, 3]
    assert [t.end for t in group.trajectories] == ["answer", "answer"]  # solved; truncated after 3 tries
    for i, traj in enumerate(group.trajectories):
        assert exactness(traj, [c for c in engine.calls if c.sampling.seed == 10 + i])["mismatches"] == 0
