"""The OpenEnv adapter: an OpenEnv (openenv-core 0.3) environment server played as an ``Environment``.

Owns ``agent.env=openenv:<url>[#field]``. An OpenEnv environment is a server (``openenv.core.env_server``:
``create_app(Environment subclass, Action, Observation)``, a FastAPI app run by uvicorn; a Docker image or a
Hugging Face Space only package such a server) and clients speak to it over its WebSocket session
(``/ws``: ``reset``, ``step``, ``state``), one session per episode. This adapter is such a client, through
openenv-core's own ``GenericEnvClient`` (actions and observations as JSON objects):

- the action's text field is the one string property of the server's action schema (``GET /schema``),
  or the one named after ``#`` (``openenv:http://127.0.0.1:8000#message``); read once per server, when the run
  starts, so a server that is down or an action without a single text field is refused in one line then;
- ``reset``: a new session, ``reset(seed=..., episode_id=prompt id)`` (the seed from ``run.seed`` and the
  prompt's id, so a group's episodes see the same instance); the opening user turn is the prompt's question
  followed by the observation's text;
- ``step``: the model turn's whole text is the action's field; the observation's text is the next user turn,
  its ``reward`` adds to the episode's reward (the sum of step rewards), its ``done`` ends the episode.

An observation's text is its one string field other than ``metadata``, else its fields as JSON. Running the
server is the user's: ``uvicorn my_env.server.app:app --port 8000`` runs one locally, no Docker needed.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from asyncrl.rollout.envs.base import EnvOptions, EnvReset, Message, ModelTurn, StepResult
from asyncrl.rollout.envs.gym import episode_seed
from asyncrl.types import Prompt

__all__ = ["OpenEnvEnv", "action_field", "make_openenv", "observation_text"]

_FIELDS: dict[str, str] = {}
"""Server URL -> its action's text field (read once per server)."""
_RESERVED = ("metadata", "done", "reward")


def action_field(url: str, named: str = "", timeout_s: float = 10.0) -> str:
    """The action's text field of the OpenEnv server at ``url`` (its schema's one string property, or ``named``
    when the schema has it); ValueError (one line) when the server does not answer or has none such."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/schema", timeout=timeout_s) as response:  # noqa: S310
            schema = json.loads(response.read())["action"]
    except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
        raise ValueError(
            f"agent.env=openenv:{url}: no OpenEnv schema at {url}/schema ({type(e).__name__}: {e})"
        ) from None
    props = {k: v for k, v in schema.get("properties", {}).items() if k not in _RESERVED}
    texts = [k for k, v in props.items() if v.get("type") == "string"]
    if named:
        if named not in props:
            raise ValueError(f"agent.env=openenv:{url}#{named}: the action has no field {named!r} ({', '.join(props)})")
        return named
    if len(texts) != 1:
        raise ValueError(
            f"agent.env=openenv:{url}: the action has {len(texts)} string fields ({', '.join(texts) or 'none'}); "
            "name the one the model's text fills: openenv:URL#FIELD"
        )
    return texts[0]


def observation_text(observation: dict[str, Any]) -> str:
    """The text a model sees of an observation (see the module docstring)."""
    fields = {k: v for k, v in observation.items() if k not in _RESERVED}
    strings = [v for v in fields.values() if isinstance(v, str)]
    if len(strings) == 1:
        return strings[0]
    return json.dumps(fields, sort_keys=True, default=str)


class OpenEnvEnv:
    """One episode: one session on an OpenEnv server (see the module docstring)."""

    def __init__(self, url: str, field: str, seed: int = 0) -> None:
        self.url = url
        self.field = field
        self.seed = seed
        self.client: Any = None

    async def reset(self, prompt: Prompt) -> EnvReset:
        from openenv.core.generic_client import GenericEnvClient

        self.client = GenericEnvClient(base_url=self.url)
        await self.client.connect()
        result = await self.client.reset(seed=episode_seed(self.seed, prompt.prompt_id), episode_id=prompt.prompt_id)
        question = prompt.meta.get("question")
        parts = [question if isinstance(question, str) else "", observation_text(result.observation)]
        return EnvReset(messages=(Message("user", "\n\n".join(p for p in parts if p)),), scores=True)

    async def step(self, turn: ModelTurn) -> StepResult:
        if self.client is None:
            raise RuntimeError("OpenEnvEnv.step before reset")
        result = await self.client.step({self.field: turn.text})
        done = bool(result.done)
        messages = () if done else (Message("user", observation_text(result.observation)),)
        return StepResult(messages=messages, done=done, reward=float(result.reward or 0.0), kind="user")

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
            self.client = None


def make_openenv(target: str, options: EnvOptions) -> OpenEnvEnv:
    """One episode's ``Environment`` on the OpenEnv server ``target`` (``url`` or ``url#field``)."""
    url, _, named = target.partition("#")
    if not url.startswith(("http://", "https://")):
        raise ValueError(
            f"agent.env=openenv:{target}: needs the server's http://host:port, e.g. openenv:http://127.0.0.1:8000"
        )
    import openenv.core  # noqa: F401  (fails here, in one line at the start, when openenv-core is not installed)

    if target not in _FIELDS:
        _FIELDS[target] = action_field(url, named)
    return OpenEnvEnv(url, _FIELDS[target], options.seed)
