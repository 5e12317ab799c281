"""Every OpenAI chat-completions request field (``openai_request.FIELDS``): the table covers each parameter of the
installed ``openai`` client's ``chat.completions.create``; the manual's table (docs/agent.md) is ``FIELDS`` row for
row; and the door behaves as the table says, field by field: a supported field's value is served (a bad one is a 400
naming it), an ignored one is served and changes nothing the engine is given, a refused one is served only at its
neutral value and otherwise is a 400 naming the field and the reason."""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Sequence
from typing import Any

import pytest

from asyncrl.rollout.openai_door import ChatDoor
from asyncrl.rollout.openai_request import FIELDS
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Completion
from asyncrl.web import HTTPError
from tests.repo_paths import REPO
from tests.rollout.chat_templates import qwen_tokenizer

TOOL = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object", "properties": {}}}}
BASE = {"messages": [{"role": "user", "content": "2*3"}], "seed": 1}
_NO = object()
# field -> (a value served as the table says, a value that is a 400, or _NO); for a refused field the first is its
# neutral value and the second a real one
SAMPLES: dict[str, tuple[Any, Any]] = {
    "messages": ([{"role": "user", "content": "hi"}], []),
    "model": ("asyncrl", 5),
    "audio": (None, {"voice": "alloy", "format": "wav"}),
    "frequency_penalty": (0, 0.5),
    "function_call": (None, "auto"),
    "functions": (None, [{"name": "f"}]),
    "logit_bias": ({}, {"42": 5}),
    "logprobs": (True, "yes"),
    "max_completion_tokens": (4, 0),
    "max_tokens": (4, -1),
    "metadata": ({"k": "v"}, "x"),
    "modalities": (["text"], ["text", "audio"]),
    "moderation": (None, {"model": "omni"}),
    "n": (2, 0),
    "parallel_tool_calls": (False, "no"),
    "prediction": (None, {"type": "content", "content": "#6"}),
    "presence_penalty": (0, 1.0),
    "prompt_cache_key": ("k1", 5),
    "prompt_cache_options": ({"ttl": "5m"}, _NO),
    "prompt_cache_retention": ("24h", _NO),
    "reasoning_effort": (None, "low"),
    "response_format": ({"type": "text"}, {"type": "json_object"}),
    "safety_identifier": ("u1", 5),
    "seed": (7, 1.5),
    "service_tier": ("auto", 5),
    "stop": ("</tool_call>", "the end"),
    "store": (True, "no"),
    "stream": (True, "yes"),
    "stream_options": ({"include_usage": True}, {"include_usage": 1}),
    "temperature": (0.5, 3),
    "tool_choice": ("none", "sometimes"),
    "tools": ([TOOL], [{"type": "web"}]),
    "top_logprobs": (0, 5),
    "top_p": (0.5, 0),
    "user": ("u", 5),
    "verbosity": (None, "low"),
    "web_search_options": (None, {"search_context_size": "low"}),
}
NEEDS = {"stream_options": {"stream": True}, "top_logprobs": {"logprobs": True}}


class _Fixed:
    """An engine that answers every sample with the same turn (and records what it was given)."""

    version = 0
    reports_each_sample = False

    def __init__(self, ids: tuple[int, ...]) -> None:
        self.ids = ids
        self.calls: list[tuple[tuple[int, ...], SamplingParams, int]] = []

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, n: int = 1, on_sample_done=None):
        self.calls.append((tuple(input_ids), sampling, n))
        lps = tuple(-0.5 for _ in self.ids)
        return [Completion(tuple(input_ids), self.ids, lps, (0,) * len(self.ids), "stop") for _ in range(n)]


@pytest.fixture(scope="module")
def tok():
    return qwen_tokenizer()


def _ask(tok, body: dict[str, Any]) -> tuple[Any, _Fixed]:
    engine = _Fixed((*tok.encode("#6", add_special_tokens=False), tok.eos_token_id))
    door = ChatDoor(engine, tok, end_of_turn_ids=(tok.eos_token_id,))
    return asyncio.run(door.chat(body, None)), engine


def test_the_table_covers_every_field_of_the_openai_client() -> None:
    from openai.resources.chat.completions import Completions

    client = set(inspect.signature(Completions.create).parameters) - {
        "self",
        "extra_headers",
        "extra_query",
        "extra_body",
        "timeout",
    }
    assert set(FIELDS) == client
    assert set(SAMPLES) == set(FIELDS)


def test_the_manuals_table_is_the_doors() -> None:
    text = (REPO / "docs" / "agent.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| (supported|ignored|refused) \| (.*) \|$", text, flags=re.M)
    assert [name for name, _, _ in rows] == sorted(FIELDS)
    for name, treatment, what in rows:
        assert (treatment, what.replace("\\|", "|")) == (FIELDS[name].treatment, FIELDS[name].what), name


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_the_door_does_what_the_table_says(tok, name: str) -> None:
    rule, (good, bad) = FIELDS[name], SAMPLES[name]
    plain, plain_engine = _ask(tok, dict(BASE))
    served, engine = _ask(tok, {**BASE, **NEEDS.get(name, {}), name: good})
    assert served is not None and len(engine.calls) == 1
    if rule.treatment in ("ignored", "refused"):  # served as if it were not there
        assert engine.calls == plain_engine.calls
    if bad is not _NO:
        with pytest.raises(HTTPError) as e:
            _ask(tok, {**BASE, **NEEDS.get(name, {}), name: bad})
        assert e.value.status == 400 and name in e.value.message
        if rule.treatment == "refused":
            assert rule.what in e.value.message
    else:
        assert rule.treatment == "ignored"
