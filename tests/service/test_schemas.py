"""The request fields the service honours in one value only (``schemas.Unsupported``): each body the client
sends by default passes, and each value the service does not honour is named in the route's one 400."""

from __future__ import annotations

from typing import Any

import pytest

from asyncrl.service import schemas
from asyncrl.service.routes import _refuse
from asyncrl.web.checks import HTTPError
from asyncrl.web.schema import parse_body

SAMPLE = {"prompt": {"chunks": []}, "sampling_params": {}}
LOAD = {"path": "tinker://run/weights/x", "optimizer": False}

CASES: list[tuple[type, dict[str, Any], dict[str, Any], list[str]]] = [
    (schemas.CreateSessionBody, {"tags": [], "sdk_version": "0"}, {"project_id": "p"}, ["project_id"]),
    (
        schemas.CreateModelBody,
        {"session_id": "s", "model_seq_id": 0, "base_model": "b"},
        {"optimizer_config": {"type": "sgd"}},
        ["optimizer_config.type='sgd' (only adamw)"],
    ),
    (schemas.OptimStepBody, {"model_id": "m"}, {"optimizer_params": {}}, ["optimizer_params (only adam_params)"]),
    (schemas.SaveWeightsBody, {"model_id": "m"}, {"ttl_seconds": 60}, ["ttl_seconds (checkpoints here never expire)"]),
    (
        schemas.SaveForSamplerBody,
        {"model_id": "m"},
        {"kind": "inflight", "ttl_seconds": 60},
        ["kind=inflight", "ttl_seconds (checkpoints here never expire)"],
    ),
    (
        schemas.LoadWeightsBody,
        LOAD,
        {"weights_access_token": "t", "optimizer_config": {}, "base_model": "b"},
        ["weights_access_token", "optimizer_config", "base_model (the checkpoint's own is used)"],
    ),
    (
        schemas.SampleBody,
        SAMPLE,
        {
            "topk_prompt_logprobs": 2,
            "topk_sample_logprobs": 3,
            "target_prompt_logprobs": [],
            "prompt_alt_tokens_k": 1,
            "record_stability_info": True,
        },
        [
            "topk_prompt_logprobs",
            "topk_sample_logprobs",
            "target_prompt_logprobs",
            "prompt_alt_tokens_k",
            "record_stability_info",
        ],
    ),
]


@pytest.mark.parametrize(("schema", "base", "refused", "labels"), CASES, ids=[c[0].__name__ for c in CASES])
def test_each_value_not_honoured_is_named_in_field_order(
    schema: type, base: dict[str, Any], refused: dict[str, Any], labels: list[str]
) -> None:
    assert schemas.unsupported(parse_body(schema, base)) == []
    assert schemas.unsupported(parse_body(schema, {**base, **refused})) == labels
    for (key, value), label in zip(refused.items(), labels, strict=True):  # one at a time: only that one
        assert schemas.unsupported(parse_body(schema, {**base, key: value})) == [label]


@pytest.mark.parametrize(
    ("schema", "honoured"),
    [
        (schemas.CreateModelBody, {"optimizer_config": {}}),  # no type: AdamW
        (schemas.CreateModelBody, {"optimizer_config": {"type": "adamw", "lr": 1.0}}),
        (schemas.LoadWeightsBody, {"optimizer_config": {"type": "adamw"}}),
        (schemas.SampleBody, {"record_stability_info": False}),
        (schemas.SampleBody, {"prompt_logprobs": True, "prompt_logprobs_last_n": 2}),  # served
    ],
)
def test_values_the_service_honours_pass(schema: type, honoured: dict[str, Any]) -> None:
    base = next(base for s, base, _, _ in CASES if s is schema)
    assert schemas.unsupported(parse_body(schema, {**base, **honoured})) == []


def test_the_route_refuses_them_all_in_one_400() -> None:
    body = parse_body(schemas.SaveForSamplerBody, {"model_id": "m", "kind": "inflight", "ttl_seconds": 1})
    with pytest.raises(HTTPError) as refused:
        _refuse(body, "save_weights_for_sampler")
    assert refused.value.status == 400
    assert refused.value.message == (
        "save_weights_for_sampler: not supported by this service: kind=inflight, "
        "ttl_seconds (checkpoints here never expire)"
    )
    _refuse(parse_body(schemas.SaveForSamplerBody, {"model_id": "m"}), "save_weights_for_sampler")  # nothing to refuse
