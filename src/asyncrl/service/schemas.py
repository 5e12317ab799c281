"""The JSON bodies of the Tinker-compatible service's routes, as :mod:`asyncrl.web.schema` schemas.

One frozen dataclass per request body of the official client (``tinker.types``, as its resources send
them: every field that is not None, defaults included), read and checked by
:func:`asyncrl.web.schema.parse_body`: a key the schema does not name is a 400 that names it. Fields
the client always sends but the service does not honour in every value (``topk_sample_logprobs``, a
non-Adam optimizer, ``ttl_seconds``...) are marked here, ``Annotated[T, Unsupported(...)]``, with the value
the service honours (their default unless said); :func:`unsupported` lists those a body sets otherwise,
and the handlers refuse them with one 400 naming them all.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args, get_origin, get_type_hints

from asyncrl.web.schema import Spec

__all__ = [
    "AdamBody",
    "CreateModelBody",
    "CreateSamplingSessionBody",
    "CreateSessionBody",
    "FinishSessionBody",
    "GetInfoBody",
    "HeartbeatBody",
    "JoinSamplingBody",
    "LoadWeightsBody",
    "LoraBody",
    "ModelInputBody",
    "OptimStepBody",
    "RetrieveFutureBody",
    "SampleBody",
    "SamplingParamsBody",
    "SaveForSamplerBody",
    "SaveWeightsBody",
    "SdkVersionBody",
    "Unsupported",
    "unsupported",
]

NonNegative = Annotated[float, Spec(what="a finite number >= 0", check=lambda v: v >= 0)]
SeqId = Annotated[int, Spec(what="an integer >= 0", check=lambda v: v >= 0)]
Positive = Annotated[int, Spec(what="an integer >= 1", check=lambda v: v >= 1)]


@dataclass(frozen=True)
class Unsupported:
    """A field this service honours in one value only (``Annotated[T, Unsupported(...)]``): any other is
    refused, named by ``label`` (default: the field's name)."""

    label: str | Callable[[Any], str] | None = None
    """The refusal's words for the field; a callable gets the value sent."""
    honoured: Callable[[Any], bool] | None = None
    """Whether a value is one the service honours (default: the field's default only)."""


def unsupported(body: Any) -> list[str]:
    """The labels of the ``Unsupported`` fields that ``body`` (a schema of this module) sets to a value the
    service does not honour, in field order."""
    found = []
    for field, mark in _marked(type(body)):
        value = getattr(body, field.name)
        if mark.honoured(value) if mark.honoured is not None else value == field.default:
            continue
        label = mark.label(value) if callable(mark.label) else mark.label
        found.append(label or field.name)
    return found


@functools.cache
def _marked(schema: type) -> tuple[tuple[dataclasses.Field, Unsupported], ...]:
    hints = get_type_hints(schema, include_extras=True)
    marked = []
    for field in dataclasses.fields(schema):
        hint = hints[field.name]
        extras = get_args(hint)[1:] if get_origin(hint) is Annotated else ()
        marked += [(field, mark) for mark in extras if isinstance(mark, Unsupported)]
    return tuple(marked)


def _optimizer(config: dict | None) -> Any:
    """The optimizer a ``create_model`` body's ``optimizer_config`` names (none, or no ``type``: AdamW)."""
    return (config or {}).get("type", "adamw")


def _none_or_adamw(config: dict | None) -> bool:
    """A ``load_weights`` body's ``optimizer_config``: none, or one that names AdamW (``type``)."""
    return config is None or config.get("type") == "adamw"


NEVER_EXPIRE = Unsupported("ttl_seconds (checkpoints here never expire)")
ONLY_ADAMW = Unsupported(
    lambda v: f"optimizer_config.type={_optimizer(v)!r} (only adamw)", lambda v: _optimizer(v) == "adamw"
)


@dataclass(frozen=True)
class SdkVersionBody:
    """``/client/config`` and ``/client/dynamic_config``."""

    sdk_version: str


@dataclass(frozen=True)
class CreateSessionBody:
    tags: list[str]
    sdk_version: str
    user_metadata: dict | None = None
    project_id: Annotated[str | None, Unsupported()] = None
    display_name: str | None = None
    type: Literal["create_session"] = "create_session"


@dataclass(frozen=True)
class HeartbeatBody:
    session_id: str
    type: Literal["session_heartbeat"] = "session_heartbeat"


@dataclass(frozen=True)
class FinishSessionBody:
    """``/sessions/{id}/finish``, sent by ``ServiceClient.close``."""

    reason: Any = None
    detail: str | None = None


@dataclass(frozen=True)
class LoraBody:
    rank: Positive
    seed: int | None = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


@dataclass(frozen=True)
class CreateModelBody:
    session_id: str
    model_seq_id: SeqId
    base_model: str
    user_metadata: dict | None = None
    lora_config: LoraBody | None = None
    optimizer_config: Annotated[dict | None, ONLY_ADAMW] = None
    type: Literal["create_model"] = "create_model"


@dataclass(frozen=True)
class GetInfoBody:
    model_id: str
    type: Literal["get_info"] = "get_info"


@dataclass(frozen=True)
class AdamBody:
    learning_rate: NonNegative = 1e-4
    beta1: NonNegative = 0.9
    beta2: NonNegative = 0.95
    eps: NonNegative = 1e-12
    weight_decay: NonNegative = 0.0
    grad_clip_norm: float = 0.0


@dataclass(frozen=True)
class OptimStepBody:
    model_id: str
    adam_params: AdamBody | None = None
    optimizer_params: Annotated[dict | None, Unsupported("optimizer_params (only adam_params)")] = None
    seq_id: int | None = None
    type: Literal["optim_step"] = "optim_step"


@dataclass(frozen=True)
class SaveWeightsBody:
    model_id: str
    path: str | None = None
    seq_id: int | None = None
    ttl_seconds: Annotated[int | None, NEVER_EXPIRE] = None
    overwrite: bool = False
    user_metadata: dict | None = None
    type: Literal["save_weights"] = "save_weights"


@dataclass(frozen=True)
class SaveForSamplerBody:
    model_id: str
    path: str | None = None
    sampling_session_seq_id: int | None = None
    kind: Annotated[Literal["snapshot", "inflight"], Unsupported(lambda v: f"kind={v}")] = "snapshot"
    seq_id: int | None = None
    ttl_seconds: Annotated[int | None, NEVER_EXPIRE] = None
    user_metadata: dict | None = None
    type: Literal["save_weights_for_sampler"] = "save_weights_for_sampler"


@dataclass(frozen=True)
class LoadWeightsBody:
    path: str
    optimizer: bool
    model_id: str | None = None
    seq_id: int | None = None
    session_id: str | None = None
    model_seq_id: int | None = None
    weights_access_token: Annotated[str | None, Unsupported()] = None
    optimizer_config: Annotated[dict | None, Unsupported(honoured=_none_or_adamw)] = None
    base_model: Annotated[str | None, Unsupported("base_model (the checkpoint's own is used)")] = None
    user_metadata: dict | None = None
    type: Literal["load_weights"] = "load_weights"


@dataclass(frozen=True)
class CreateSamplingSessionBody:
    session_id: str
    sampling_session_seq_id: SeqId
    base_model: str | None = None
    model_path: str | None = None
    type: Literal["create_sampling_session"] = "create_sampling_session"


@dataclass(frozen=True)
class JoinSamplingBody:
    sampling_session_id: str
    type: Literal["join_sampling_session"] = "join_sampling_session"


@dataclass(frozen=True)
class ModelInputBody:
    """``ModelInput``: text chunks (``{"type": "encoded_text", "tokens": [...]}``) only."""

    chunks: list[dict]


@dataclass(frozen=True)
class SamplingParamsBody:
    max_tokens: int | None = None
    seed: int | None = None
    stop: Any = None
    temperature: NonNegative = 1.0
    top_k: int = -1
    top_p: Annotated[float, Spec(what="a number in (0, 1]", check=lambda v: 0 < v <= 1)] = 1.0


@dataclass(frozen=True)
class SampleBody:
    prompt: ModelInputBody
    sampling_params: SamplingParamsBody
    num_samples: Positive = 1
    base_model: str | None = None
    model_path: str | None = None
    sampling_session_id: str | None = None
    seq_id: int | None = None
    prompt_logprobs: bool | None = None
    topk_prompt_logprobs: Annotated[int, Unsupported()] = 0
    topk_sample_logprobs: Annotated[int, Unsupported()] = 0
    target_prompt_logprobs: Annotated[Any, Unsupported()] = None
    prompt_alt_tokens_k: Annotated[int, Unsupported()] = 0
    prompt_logprobs_last_n: int | None = None
    record_stability_info: Annotated[bool | None, Unsupported(honoured=lambda v: not v)] = None
    type: Literal["sample"] = "sample"


@dataclass(frozen=True)
class RetrieveFutureBody:
    request_id: str
    allow_metadata_only: bool = False
