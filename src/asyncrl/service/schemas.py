"""The JSON bodies of the Tinker-compatible service's routes, as :mod:`asyncrl.web.schema` schemas.

One frozen dataclass per request body of the official client (``tinker.types``, as its resources send
them: every field that is not None, defaults included), read and checked by
:func:`asyncrl.web.schema.parse_body`: a key the schema does not name is a 400 that names it. Fields
the client always sends but the service does not honour in every value (``prompt_logprobs``,
``topk_sample_logprobs``, a non-Adam optimizer, ``ttl_seconds``...) are named here and refused by the
handlers, when set to anything but their neutral value, with a 400 naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

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
]

NonNegative = Annotated[float, Spec(what="a finite number >= 0", check=lambda v: v >= 0)]
SeqId = Annotated[int, Spec(what="an integer >= 0", check=lambda v: v >= 0)]


@dataclass(frozen=True)
class SdkVersionBody:
    """``/client/config`` and ``/client/dynamic_config``."""

    sdk_version: str


@dataclass(frozen=True)
class CreateSessionBody:
    tags: list[str]
    sdk_version: str
    user_metadata: dict | None = None
    project_id: str | None = None
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
    rank: Annotated[int, Spec(what="an integer >= 1", check=lambda v: v >= 1)]
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
    optimizer_config: dict | None = None
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
    optimizer_params: dict | None = None
    seq_id: int | None = None
    type: Literal["optim_step"] = "optim_step"


@dataclass(frozen=True)
class SaveWeightsBody:
    model_id: str
    path: str | None = None
    seq_id: int | None = None
    ttl_seconds: int | None = None
    overwrite: bool = False
    user_metadata: dict | None = None
    type: Literal["save_weights"] = "save_weights"


@dataclass(frozen=True)
class SaveForSamplerBody:
    model_id: str
    path: str | None = None
    sampling_session_seq_id: int | None = None
    kind: Literal["snapshot", "inflight"] = "snapshot"
    seq_id: int | None = None
    ttl_seconds: int | None = None
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
    base_model: str | None = None
    user_metadata: dict | None = None
    optimizer_config: dict | None = None
    weights_access_token: str | None = None
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
    num_samples: Annotated[int, Spec(what="an integer >= 1", check=lambda v: v >= 1)] = 1
    base_model: str | None = None
    model_path: str | None = None
    sampling_session_id: str | None = None
    seq_id: int | None = None
    prompt_logprobs: bool | None = None
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    target_prompt_logprobs: Any = None
    prompt_alt_tokens_k: int = 0
    prompt_logprobs_last_n: int | None = None
    record_stability_info: bool | None = None
    type: Literal["sample"] = "sample"


@dataclass(frozen=True)
class RetrieveFutureBody:
    request_id: str
    allow_metadata_only: bool = False
