"""The engine server's request bodies as schemas (``asyncrl.web.schema``), and ``/generate`` read into
``SamplingParams``.

Owns what the engine server accepts (see ``rollout.server`` for the endpoints): :class:`GenerateBody`
(``input_ids`` or ``text``, ``sampling_params`` by SGLang's names, ``return_logprob``, ``rid``; other
top-level keys SGLang clients send are ignored), :class:`SamplingBody` (an unknown option, or one this
engine does not honour at anything but its neutral value, is refused), :class:`PauseBody` and
:class:`UpdateWeightsBody`. The schema names every bad field (400); :func:`parse_generate` then checks
what depends on the server: more than ``max_samples`` samples (prompts x ``n``) and ``text`` of more than
``max_chars`` characters, both before anything is tokenised, then the prompts against the vocabulary and
the context. Numbers must be finite (``json.loads`` reads ``NaN``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from asyncrl.rollout.sampling import SamplingParams
from asyncrl.web import HTTPError, Spec, is_int, parse_body

__all__ = [
    "GenerateBody",
    "GenerateRequest",
    "PauseBody",
    "SamplingBody",
    "UpdateWeightsBody",
    "bad_request",
    "parse_generate",
]


def bad_request(msg: str) -> HTTPError:
    return HTTPError(400, msg)


def _neutral(value: float) -> Spec:
    """An option accepted at its neutral value only (clients such as AReaL's send it by default)."""
    return Spec(f"{value!r} (the only value this server supports) or null", lambda v: v == value)


_IGNORED = Spec("any value (ignored)")


@dataclass(frozen=True)
class SamplingBody:
    """``sampling_params`` of a ``/generate`` (SGLang's names); ``n``'s upper bound is the server's."""

    unknown_fields: ClassVar[str] = "refuse"
    max_new_tokens: Annotated[int, Spec("an integer >= 1", lambda v: v >= 1)] = 128
    temperature: Annotated[float, Spec("a finite number >= 0", lambda v: v >= 0)] = 1.0
    top_p: Annotated[float, Spec("a number in (0, 1]", lambda v: 0 < v <= 1)] = 1.0
    top_k: Annotated[int, Spec("an integer (-1 or 0 = off)")] = -1
    n: Annotated[int, Spec("an integer >= 1", lambda v: v >= 1)] = 1
    stop_token_ids: list[int] | None = None
    sampling_seed: int | None = None
    seed: int | None = None
    """An alias of ``sampling_seed``."""
    ignore_eos: bool = False
    stop: Annotated[
        Any, Spec("empty (string stop sequences are not supported; use 'stop_token_ids')", lambda v: not v)
    ] = None
    frequency_penalty: Annotated[Any, _neutral(0.0)] = None
    presence_penalty: Annotated[Any, _neutral(0.0)] = None
    repetition_penalty: Annotated[Any, _neutral(1.0)] = None
    min_new_tokens: Annotated[Any, _neutral(0)] = None
    min_p: Annotated[Any, _neutral(0.0)] = None
    skip_special_tokens: Annotated[Any, _IGNORED] = None
    spaces_between_special_tokens: Annotated[Any, _IGNORED] = None
    no_stop_trim: Annotated[Any, _IGNORED] = None


def _prompt_ids(value: Any) -> bool:
    """A non-empty prompt, or a non-empty batch of non-empty prompts."""
    return bool(value) and (all(is_int(t) for t in value) or all(isinstance(p, list) and p for p in value))


def _texts(value: Any) -> bool:
    return isinstance(value, str) or bool(value)


@dataclass(frozen=True)
class GenerateBody:
    """A ``/generate`` body (SGLang's native API); keys it does not name are ignored, as SGLang's clients
    send more (``image_data``, ``lora_path``, ...)."""

    unknown_fields: ClassVar[str] = "ignore"
    input_ids: Annotated[
        list[int] | list[list[int]] | None, Spec("a non-empty list of ints (or a list of such lists)", _prompt_ids)
    ] = None
    text: Annotated[str | list[str] | None, Spec("a string or a non-empty list of strings", _texts)] = None
    sampling_params: SamplingBody | None = None
    return_logprob: bool = False
    rid: str | None = None
    stream: Annotated[Any, Spec("false (stream=true is not supported by this server)", lambda v: not v)] = False


@dataclass(frozen=True)
class PauseBody:
    """A ``/pause_generation`` body (none: abort, as SGLang)."""

    unknown_fields: ClassVar[str] = "ignore"
    mode: Literal["abort", "in_place"] = "abort"


def _weight_version(raw: Any) -> int:
    """An int or the string of one (SGLang sends strings)."""
    if isinstance(raw, str) and re.fullmatch(r"\s*[+-]?[0-9]{1,18}\s*", raw):
        raw = int(raw)
    if not is_int(raw) or abs(raw) >= 1 << 62:
        raise ValueError(raw)
    return int(raw)


@dataclass(frozen=True)
class UpdateWeightsBody:
    """An ``/update_weights_from_disk`` body; ``weight_version`` None: the engine's next."""

    unknown_fields: ClassVar[str] = "ignore"
    model_path: str
    weight_version: Annotated[int | None, Spec("an integer (or its string)", convert=_weight_version)] = None
    abort_all_requests: bool = False


@dataclass(frozen=True)
class GenerateRequest:
    """A validated ``/generate`` body."""

    prompts: list[list[int]]
    sampling: SamplingParams
    n: int
    return_logprob: bool
    rid: str | None
    batched: bool
    """The input was a list of prompts: answer with a list even for one result."""


def parse_generate(
    body: Any,
    *,
    max_slots: int,
    max_seq_len: int,
    vocab_size: int,
    eos_ids: tuple[int, ...],
    tokenizer: Any,
    max_samples: int | None = None,
    max_chars: int | None = None,
) -> GenerateRequest:
    """Read a ``/generate`` body. Raises ``HTTPError`` (400) with the reason. ``max_samples``: the most
    prompts x ``n`` of one request; ``max_chars``: the most characters of ``text`` (None: unbounded)."""
    g = parse_body(GenerateBody, body)
    sp = g.sampling_params or SamplingBody()
    if (g.input_ids is None) == (g.text is None):
        raise bad_request("give exactly one of 'input_ids' or 'text'")
    if sp.n > max_slots:
        raise bad_request(f"'sampling_params.n' must be an integer in [1, {max_slots}], got {sp.n}")
    if g.text is not None:
        batched = not isinstance(g.text, str)
        prompts = _tokenised([g.text] if isinstance(g.text, str) else g.text, sp.n, tokenizer, max_samples, max_chars)
    else:
        assert g.input_ids is not None
        batched = isinstance(g.input_ids[0], list)
        prompts = g.input_ids if batched else [g.input_ids]  # type: ignore[list-item]
        _check_samples(len(prompts), sp.n, max_samples)
    for p in prompts:
        if not p:
            raise bad_request("a prompt encodes to no tokens (empty 'text'): give each prompt at least one token")
        if len(p) >= max_seq_len:
            raise bad_request(
                f"input too long: {len(p)} tokens; the server's context (max_seq_len) is {max_seq_len} tokens"
            )
        if min(p) < 0 or max(p) >= vocab_size:
            raise bad_request(f"input_ids must lie in [0, {vocab_size})")
    stops = tuple(dict.fromkeys(list(sp.stop_token_ids or []) + ([] if sp.ignore_eos else list(eos_ids))))
    seed = sp.sampling_seed if sp.sampling_seed is not None else sp.seed
    sampling = SamplingParams(
        max_new_tokens=sp.max_new_tokens,
        temperature=sp.temperature,
        top_p=sp.top_p,
        top_k=max(sp.top_k, 0),
        greedy=sp.temperature == 0,
        stop_token_ids=stops,
        seed=None if seed is None else seed % (1 << 31),
    )
    return GenerateRequest(prompts, sampling, sp.n, g.return_logprob, g.rid, batched)


def _tokenised(
    texts: list[str], n: int, tokenizer: Any, max_samples: int | None, max_chars: int | None
) -> list[list[int]]:
    """The prompts of ``text``, its caps checked before anything is tokenised."""
    _check_samples(len(texts), n, max_samples)
    chars = sum(len(t) for t in texts)
    if max_chars is not None and chars > max_chars:
        raise bad_request(
            f"'text' holds {chars} characters; this server reads at most {max_chars} per "
            "request (max_request_chars): send fewer or shorter prompts, or 'input_ids'"
        )
    for t in texts:  # JSON escapes can carry lone surrogates, which no tokenizer encodes
        try:
            t.encode("utf-8")
        except UnicodeEncodeError as e:
            raise bad_request(f"'text' is not valid Unicode: a lone surrogate at character {e.start}") from None
    if tokenizer is None:
        raise bad_request("this server has no tokenizer; send 'input_ids'")
    return [list(tokenizer(t)["input_ids"]) for t in texts]


def _check_samples(prompts: int, n: int, max_samples: int | None) -> None:
    if max_samples is not None and prompts * n > max_samples:
        raise bad_request(
            f"this request asks for {prompts * n} samples ({prompts} prompts x n={n}); this server takes at most "
            f"{max_samples} per request (max_samples_per_request): split it into several requests"
        )
