"""The ``/generate`` request of the SGLang-native protocol: validation into ``SamplingParams``.

Owns what the engine server accepts (see ``rollout.server`` for the endpoints): ``input_ids`` or
``text``, ``sampling_params`` (SGLang names), ``return_logprob``, ``rid``. Anything malformed,
unknown or unsupported raises ``HTTPError(400)`` with the reason, and so do a request for more than
``max_samples`` samples (prompts x ``n``) and ``text`` of more than ``max_chars`` characters, both
checked before anything is tokenised. Numbers must be finite (``json.loads`` reads ``NaN``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asyncrl.rollout.sampling import SamplingParams
from asyncrl.web import HTTPError, is_finite, is_int

__all__ = ["GenerateRequest", "parse_generate", "bad_request"]

# Options we accept only at their neutral value (clients such as AReaL's send them by default).
_NEUTRAL = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "min_p": 0.0,
}
_IGNORED = {"skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"}
_SUPPORTED = {
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop_token_ids",
    "n",
    "sampling_seed",
    "seed",
}
_SUPPORTED |= {"ignore_eos", "stop"} | set(_NEUTRAL) | _IGNORED


def bad_request(msg: str) -> HTTPError:
    return HTTPError(400, msg)


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
    """Validate a ``/generate`` body. Raises ``HTTPError`` (400) with the reason. ``max_samples``: the most
    prompts x ``n`` of one request; ``max_chars``: the most characters of ``text`` (None: unbounded)."""
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    if body.get("stream"):
        raise bad_request("stream=true is not supported by this server")
    ids, text = body.get("input_ids"), body.get("text")
    if (ids is None) == (text is None):
        raise bad_request("give exactly one of 'input_ids' or 'text'")
    sp = body.get("sampling_params", {})
    if sp is None:
        sp = {}
    if not isinstance(sp, dict):
        raise bad_request("'sampling_params' must be an object")
    n = sp.get("n", 1)
    if not is_int(n) or not 1 <= n <= max_slots:
        raise bad_request(f"sampling_params.n must be an int in [1, {max_slots}]")
    if text is not None:
        texts = [text] if isinstance(text, str) else text
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise bad_request("'text' must be a string or a non-empty list of strings")
        _check_samples(len(texts), n, max_samples)
        chars = sum(len(t) for t in texts)
        if max_chars is not None and chars > max_chars:
            raise bad_request(f"'text' holds {chars} characters; this server reads at most {max_chars} per "
                              "request (max_request_chars): send fewer or shorter prompts, or 'input_ids'")  # fmt: skip
        for t in texts:  # JSON escapes can carry lone surrogates, which no tokenizer encodes
            try:
                t.encode("utf-8")
            except UnicodeEncodeError as e:
                raise bad_request(f"'text' is not valid Unicode: a lone surrogate at character {e.start}") from None
        if tokenizer is None:
            raise bad_request("this server has no tokenizer; send 'input_ids'")
        prompts = [list(tokenizer(t)["input_ids"]) for t in texts]
        batched = not isinstance(text, str)
    else:
        if not isinstance(ids, list) or not ids:
            raise bad_request("'input_ids' must be a non-empty list of ints (or a list of such lists)")
        batched = isinstance(ids[0], list)
        prompts = ids if batched else [ids]
        _check_samples(len(prompts), n, max_samples)
        for p in prompts:
            if not isinstance(p, list) or not p or not all(is_int(t) for t in p):
                raise bad_request("'input_ids' must be a non-empty list of ints (or a list of such lists)")
    for p in prompts:
        if not p:
            raise bad_request("a prompt encodes to no tokens (empty 'text'): give each prompt at least one token")
        if len(p) >= max_seq_len:
            raise bad_request(
                f"input too long: {len(p)} tokens; the server's context (max_seq_len) is {max_seq_len} tokens"
            )
        if min(p) < 0 or max(p) >= vocab_size:
            raise bad_request(f"input_ids must lie in [0, {vocab_size})")
    unknown = sorted(set(sp) - _SUPPORTED)
    if unknown:
        raise bad_request(f"unsupported sampling_params {unknown}; supported: {sorted(_SUPPORTED)}")
    for key, neutral in _NEUTRAL.items():
        if key in sp and sp[key] is not None and sp[key] != neutral:
            raise bad_request(f"sampling_params.{key}={sp[key]!r} is not supported (only {neutral!r})")
    if sp.get("stop"):
        raise bad_request("string stop sequences ('stop') are not supported; use 'stop_token_ids'")
    max_new = sp.get("max_new_tokens", 128)
    if not is_int(max_new) or max_new < 1:
        raise bad_request("sampling_params.max_new_tokens must be an int >= 1")
    temperature = sp.get("temperature", 1.0)
    if not is_finite(temperature) or temperature < 0:
        raise bad_request("sampling_params.temperature must be a finite number >= 0")
    top_p = sp.get("top_p", 1.0)
    if not is_finite(top_p) or not 0 < top_p <= 1:
        raise bad_request("sampling_params.top_p must be a number in (0, 1]")
    top_k = sp.get("top_k", -1)
    if not is_int(top_k):
        raise bad_request("sampling_params.top_k must be an int (-1 or 0 = off)")
    stop_ids = sp.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(is_int(t) for t in stop_ids):
        raise bad_request("sampling_params.stop_token_ids must be a list of ints")
    seed = sp.get("sampling_seed", sp.get("seed"))
    if seed is not None and not is_int(seed):
        raise bad_request("sampling_params.sampling_seed must be an int")
    ignore_eos = sp.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise bad_request("sampling_params.ignore_eos must be a bool")
    stops = tuple(dict.fromkeys(list(stop_ids) + ([] if ignore_eos else list(eos_ids))))
    return_logprob = body.get("return_logprob", False)
    if not isinstance(return_logprob, bool):
        raise bad_request("'return_logprob' must be a bool")
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise bad_request("'rid' must be a string")
    sampling = SamplingParams(
        max_new_tokens=max_new,
        temperature=float(temperature),
        top_p=float(top_p),
        top_k=max(top_k, 0),
        greedy=temperature == 0,
        stop_token_ids=stops,
        seed=None if seed is None else seed % (1 << 31),
    )
    return GenerateRequest(prompts, sampling, n, return_logprob, rid, batched)


def _check_samples(prompts: int, n: int, max_samples: int | None) -> None:
    if max_samples is not None and prompts * n > max_samples:
        raise bad_request(
            f"this request asks for {prompts * n} samples ({prompts} prompts x n={n}); this server takes at most "
            f"{max_samples} per request (max_samples_per_request): split it into several requests"
        )
