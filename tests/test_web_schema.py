"""``asyncrl.web.schema``: request bodies read into typed schemas in one place; every bad field gets one
message that names it; the engine's and the reward server's bodies through them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import pytest

from asyncrl.reward.remote import ScoreBody
from asyncrl.rollout.protocol import GenerateBody, PauseBody, UpdateWeightsBody
from asyncrl.web import HTTPError, SchemaError, Spec, parse_body


@dataclass(frozen=True)
class Inner:
    rate: Annotated[float, Spec("a number in (0, 1]", lambda v: 0 < v <= 1)] = 1.0
    tags: list[str] | None = None


@dataclass(frozen=True)
class Outer:
    name: str
    count: int = 1
    flag: bool = False
    mode: Literal["a", "b"] = "a"
    inner: Inner | None = None


@dataclass(frozen=True)
class Lenient:
    unknown_fields: ClassVar[str] = "ignore"
    name: str = ""


def _problems(schema: type, body: Any) -> tuple[str, ...]:
    with pytest.raises(SchemaError) as e:
        parse_body(schema, body)
    assert e.value.status == 400 and e.value.message == "; ".join(e.value.problems)
    return e.value.problems


def test_a_good_body_is_typed() -> None:
    got = parse_body(Outer, {"name": "x", "count": 3, "inner": {"rate": 1, "tags": ["t"]}})
    assert got == Outer("x", 3, False, "a", Inner(1.0, ["t"]))
    assert isinstance(got.inner.rate, float)  # type: ignore[union-attr]
    assert parse_body(Outer, {"name": "x", "inner": None}).inner is None


def test_every_bad_field_is_named_once() -> None:
    problems = _problems(Outer, {"count": True, "flag": 1, "mode": "c", "inner": {"rate": 2, "tags": [1]}})
    assert problems == (
        "'name' is required",
        "'count' must be an integer, got True",
        "'flag' must be a bool, got 1",
        "'mode' must be one of 'a', 'b', got 'c'",
        "'inner.rate' must be a number in (0, 1], got 2",
        "'inner.tags' must be a list of strings or null, got [1]",
    )


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 10**400, "1", None])
def test_a_float_is_a_finite_number(value: Any) -> None:
    (problem,) = _problems(Inner, {"rate": value})
    assert problem.startswith("'rate' must be a number in (0, 1], got ") and len(problem) < 120  # the value cut short


def test_unknown_keys_are_refused_or_ignored_as_the_schema_says() -> None:
    assert _problems(Outer, {"name": "x", "colour": 1, "size": 2}) == (
        "unsupported fields ['colour', 'size']; supported: ['count', 'flag', 'inner', 'mode', 'name']",
    )
    assert _problems(Outer, {"name": "x", "inner": {"speed": 1}})[0].startswith("unsupported 'inner' ['speed']")
    assert parse_body(Lenient, {"name": "x", "colour": 1}) == Lenient("x")


@pytest.mark.parametrize("body", [None, [1], "x", 3])
def test_a_body_that_is_no_object(body: Any) -> None:
    assert _problems(Lenient, body) == (f"the request body must be a JSON object, got {body!r}",)


def test_schema_error_is_an_http_400() -> None:
    assert issubclass(SchemaError, HTTPError)


@pytest.mark.parametrize(
    ("schema", "body", "message"),
    [
        (
            GenerateBody,
            {"input_ids": "hello"},
            "'input_ids' must be a non-empty list of ints (or a list of such lists)",
        ),
        (GenerateBody, {"input_ids": [[1], []]}, "'input_ids' must be a non-empty list of ints"),
        (
            GenerateBody,
            {"input_ids": [1], "sampling_params": {"top_p": 2}},
            "'sampling_params.top_p' must be a number in (0, 1], got 2",
        ),
        (
            GenerateBody,
            {"input_ids": [1], "sampling_params": {"max_new_tokens": "8"}},
            "'sampling_params.max_new_tokens' must be an integer >= 1, got '8'",
        ),
        (
            GenerateBody,
            {"input_ids": [1], "sampling_params": {"repetition_penalty": 1.2}},
            "'sampling_params.repetition_penalty' must be 1.0 (the only value this server supports) or null, got 1.2",
        ),
        (
            GenerateBody,
            {"input_ids": [1], "sampling_params": {"beam_width": 3}},
            "unsupported 'sampling_params' ['beam_width']",
        ),
        (GenerateBody, {"input_ids": [1], "stream": True}, "'stream' must be false"),
        (GenerateBody, {"input_ids": [1], "return_logprob": "yes"}, "'return_logprob' must be a bool, got 'yes'"),
        (PauseBody, {"mode": "retract"}, "'mode' must be one of 'abort', 'in_place', got 'retract'"),
        (UpdateWeightsBody, {"model_path": 3}, "'model_path' must be a string, got 3"),
        (UpdateWeightsBody, {"weight_version": 1}, "'model_path' is required"),
        (
            UpdateWeightsBody,
            {"model_path": "v", "weight_version": "1e9"},
            "'weight_version' must be an integer (or its string), got '1e9'",
        ),
        (ScoreBody, {"response": "x", "reference": "1", "row": [1]}, "'row' must be an object or null, got [1]"),
        (ScoreBody, {"response": 1}, "'response' must be a string, got 1; 'reference' is required"),
    ],
)
def test_the_servers_bodies_name_their_bad_fields(schema: type, body: Any, message: str) -> None:
    assert message in "; ".join(_problems(schema, body))


def test_the_servers_bodies_read_what_clients_send() -> None:
    """SGLang's clients send more than the engine reads (ignored at the top level), weight versions as
    strings, and ``sampling_params: null``."""
    g = parse_body(GenerateBody, {"text": "hi", "sampling_params": None, "image_data": None, "lora_path": None})
    assert g.text == "hi" and g.sampling_params is None
    update = parse_body(UpdateWeightsBody, {"model_path": "v", "weight_version": " 7 ", "flush_cache": True})
    assert update.weight_version == 7
    assert parse_body(PauseBody, {}).mode == "abort"
    assert parse_body(ScoreBody, {"response": "x", "reference": "1", "extra": 1}).verifier is None
