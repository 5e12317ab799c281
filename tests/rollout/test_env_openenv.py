"""OpenEnv environments (``agent.env=openenv:<url>[#field]``): a real OpenEnv server, an ``Environment`` subclass of
openenv-core served by its own ``create_app`` under uvicorn on loopback (no Docker), reached by the adapter
through openenv-core's ``GenericEnvClient`` session (WebSocket), played directly and through the project's
multi-turn workflow (token-exact). Ran against openenv-core 0.3.0 (asserted below)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from importlib.metadata import version
from typing import Any

import pytest

pytest.importorskip("openenv.core")

import uvicorn  # noqa: E402
from openenv.core.env_server.http_server import create_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402

from asyncrl.rollout.agent import AgentSettings, AgentWorkflow  # noqa: E402
from asyncrl.rollout.envs.base import EnvOptions, ModelTurn  # noqa: E402
from asyncrl.rollout.envs.gym import episode_seed  # noqa: E402
from asyncrl.rollout.envs.openenv import OpenEnvEnv, observation_text  # noqa: E402
from asyncrl.rollout.envs.registry import env_maker  # noqa: E402
from asyncrl.rollout.sampling import SamplingParams  # noqa: E402
from asyncrl.rollout.tools import parse_tool_calls  # noqa: E402
from asyncrl.types import Completion, Prompt  # noqa: E402
from tests.rollout.chat_templates import tiny_tokenizer  # noqa: E402
from tests.rollout.scripted_engine import ScriptedEngine, Turn, exactness  # noqa: E402

OPENENV_CORE = "0.3.0"
PROMPT = Prompt("p0", (), answer="", meta={"question": "Guess my digit."})


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    hint: str = ""


class GuessDigit(Environment):
    """An OpenEnv text game: guess the secret digit (drawn from the reset's seed) in three tries."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.secret, self.tries, self._state = 0, 0, State(step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self.secret, self.tries = (seed or 0) % 10, 0
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(hint="0-9?", done=False, reward=0.0)

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self.tries += 1
        self._state.step_count = self.tries
        digits = [int(c) for c in action.guess if c.isdigit()]
        if digits and digits[-1] == self.secret:
            return GuessObservation(hint="right", done=True, reward=1.0)
        hint = "higher" if digits and digits[-1] < self.secret else "lower"
        return GuessObservation(hint=hint, done=self.tries >= 3, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    app = create_app(GuessDigit, GuessAction, GuessObservation, env_name="guess_digit", max_concurrent_envs=8)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not srv.started:
        assert thread.is_alive()
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    srv.should_exit = True
    thread.join(10)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def turn(text: str, index: int = 0) -> ModelTurn:
    return ModelTurn(index, text, parse_tool_calls("hermes", text, {}))


SECRET = episode_seed(0, "p0") % 10


def test_the_version_and_an_episode_over_the_servers_session(server: str) -> None:
    assert version("openenv-core") == OPENENV_CORE
    env = env_maker(f"openenv:{server}", EnvOptions())()
    assert isinstance(env, OpenEnvEnv) and env.field == "guess"  # the action's one string field

    async def play():
        reset = await env.reset(PROMPT)
        miss = await env.step(turn(str((SECRET + 1) % 10)))
        hit = await env.step(turn(f"it is {SECRET}", 1))
        await env.close()
        return reset, miss, hit

    reset, miss, hit = run(play())
    assert [(m.role, m.content) for m in reset.messages] == [("user", "Guess my digit.\n\n0-9?")] and reset.scores
    assert miss.messages[0].content in ("higher", "lower") and not miss.done and miss.reward == 0.0
    assert hit.done and hit.reward == 1.0 and not hit.messages


def test_bad_targets_are_refused_in_one_line(server: str) -> None:
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    down = f"http://127.0.0.1:{port.getsockname()[1]}"
    port.close()
    for spec, fragment in {
        "openenv:localhost:8000": "needs the server's http://host:port",
        f"openenv:{down}": "no OpenEnv schema at",
        f"openenv:{server}#nope": "the action has no field 'nope'",
    }.items():
        with pytest.raises(ValueError, match="^agent.env=openenv:") as e:
            env_maker(spec, EnvOptions())
        assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert observation_text({"hint": "x", "metadata": {}, "done": False}) == "x"
    assert observation_text({"a": 1, "b": 2}) == '{"a": 1, "b": 2}'  # no one text field: the fields as JSON


def test_a_group_of_openenv_episodes_through_the_workflow(server: str, tmp_path) -> None:
    tok = tiny_tokenizer(tmp_path / "tok")

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tok.encode(text, add_special_tokens=False)) + (tok.eos_token_id,)

    miss = str((SECRET + 1) % 10)
    engine = ScriptedEngine({10: [Turn(ids(miss)), Turn(ids(str(SECRET)))], 11: [Turn(ids(miss))] * 3})
    workflow = AgentWorkflow(tok, env_maker(f"openenv:{server}#guess", EnvOptions()), AgentSettings(max_tokens=200))

    def never(prompt: Prompt, completion: Completion):
        raise AssertionError("the OpenEnv environment scores its episodes")

    group = run(workflow(engine, PROMPT, SamplingParams(max_new_tokens=20, seed=10), 2, never, start_version=0))
    assert group.rewards == (1.0, 0.0)
    assert [len(t.turns) for t in group.trajectories] == [2, 3]
    for i, traj in enumerate(group.trajectories):
        assert exactness(traj, [c for c in engine.calls if c.sampling.seed == 10 + i])["mismatches"] == 0
