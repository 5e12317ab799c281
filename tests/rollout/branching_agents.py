"""Agents on the real ``openai`` client whose episodes are not one linear chat (``agent.episode_mode`` tree or
individual): ``trim`` replaces its history by a summary halfway, ``branch`` makes two concurrent sub-calls from
one prefix and continues one of them. Each gives its second completion a reward of its own through the door's
``/reward`` route and returns the episode's reward (its reply lengths' parity, so that groups differ)."""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from openai import OpenAI

OWN_REWARD = 0.75
"""What each agent gives its second completion through ``/reward``."""


def give_reward(base_url: str, api_key: str, completion_id: str, reward: float | dict) -> dict[str, Any]:
    """``POST <session>/completions/<id>/reward`` (the session's URL is ``base_url`` less ``/v1``); a dict
    ``reward`` is sent as the body itself."""
    url = f"{base_url.removesuffix('/v1')}/completions/{completion_id}/reward"
    body = json.dumps(reward if isinstance(reward, dict) else {"reward": reward}).encode()
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    with urllib.request.urlopen(urllib.request.Request(url, body, headers, method="POST"), timeout=60) as r:
        return json.loads(r.read())


def _episode_reward(*replies: Any) -> float:
    return float(sum(len(r.choices[0].message.content or "") for r in replies) % 2)


def trim(base_url: str, api_key: str, task: dict[str, Any]) -> float:
    """Two turns, then a fresh history (a summary of the first two), then one more turn on it."""
    with OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        ask = lambda messages: client.chat.completions.create(model="m", messages=messages)  # noqa: E731
        first_messages: list[Any] = [{"role": "user", "content": task["question"]}]
        first = ask(first_messages)
        second = ask([*first_messages, first.choices[0].message, {"role": "user", "content": "Check it."}])
        give_reward(base_url, api_key, second.id, OWN_REWARD)
        summary: list[Any] = [{"role": "user", "content": f"{task['question']} (two tries so far)"}]
        third = ask(summary)
        fourth = ask([*summary, third.choices[0].message, {"role": "user", "content": "Final answer?"}])
    return _episode_reward(first, second, third, fourth)


def branch(base_url: str, api_key: str, task: dict[str, Any]) -> float:
    """One call, two concurrent sub-calls from its reply, then a call continuing the first sub-call."""
    with OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        ask = lambda messages: client.chat.completions.create(model="m", messages=messages)  # noqa: E731
        opening: list[Any] = [{"role": "user", "content": task["question"]}]
        first = ask(opening)
        prefix = [*opening, first.choices[0].message]
        subs = [[*prefix, {"role": "user", "content": f"Try way {w}."}] for w in ("A", "B")]
        with ThreadPoolExecutor(2) as pool:
            a, b = pool.map(ask, subs)
        give_reward(base_url, api_key, b.id, OWN_REWARD)
        last = ask([*subs[0], a.choices[0].message, {"role": "user", "content": "So?"}])
    return _episode_reward(first, a, b, last)
