"""The protobuf messages of the Tinker wire format that the training service reads and writes.

The official client sends ``/forward_backward`` as a protobuf ``ForwardBackwardRequest`` and asks for the
results of ``forward_backward`` and ``asample`` futures as protobuf ``ForwardBackwardOutput`` /
``SampleResponse`` (``Accept: application/x-protobuf``). This module owns that subset of the protocol
buffer wire format (varints, length-delimited fields, fixed64 doubles; packed and unpacked repeated
integers), written from the field numbers of the client's public schema, so that the product needs no
protobuf runtime and no copy of the client:

- :func:`decode_forward_backward`: the request, as a :class:`FwdBwdRequest` of plain Python and numpy;
- :func:`encode_forward_backward_output`: per-datum float32 tensors and ``name:reduction`` metrics;
- :func:`encode_sample_response`: the sampled sequences with their tokens and log-probs.

A field this module does not know is skipped (the wire format says how long it is); a chunk that is not
text (an image, audio) or a sparse tensor is refused with ``ValueError`` naming it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "FwdBwdDatum",
    "FwdBwdRequest",
    "SampledSequence",
    "decode_forward_backward",
    "encode_forward_backward_output",
    "encode_sample_response",
]

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
_DTYPES = {1: np.dtype(np.float32), 2: np.dtype(np.int64), 3: np.dtype(np.int32)}
"""The schema's ``DType`` enum -> numpy (1 float32, 2 int64, 3 int32; bfloat16 is never sent by a client)."""
DTYPE_FLOAT32 = 1
STOP_REASON = {"stop": 0, "length": 1}


@dataclass
class FwdBwdDatum:
    """One ``Datum``: the model input's tokens and its named loss inputs (flat numpy arrays)."""

    tokens: list[int]
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class FwdBwdRequest:
    """A decoded ``ForwardBackwardRequest``."""

    model_id: str = ""
    seq_id: int = 0
    loss_fn: str = ""
    forward_only: bool = False
    loss_fn_config: dict[str, float | str] = field(default_factory=dict)
    data: list[FwdBwdDatum] = field(default_factory=list)


@dataclass(frozen=True)
class SampledSequence:
    """One sampled continuation as ``SampleResponse.sequences`` carries it."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: str
    """``stop`` or ``length``."""


# ---------------------------------------------------------------------------------------------- reading
def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated protobuf varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("protobuf varint longer than 10 bytes")


def _fields(buf: bytes) -> list[tuple[int, int, int | bytes]]:
    """``(field number, wire type, value)`` of every field of one message, in order."""
    out: list[tuple[int, int, int | bytes]] = []
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == _VARINT:
            value, pos = _varint(buf, pos)
        elif wire == _FIXED64:
            value, pos = int.from_bytes(buf[pos : pos + 8], "little"), pos + 8
        elif wire == _FIXED32:
            value, pos = int.from_bytes(buf[pos : pos + 4], "little"), pos + 4
        elif wire == _LEN:
            size, pos = _varint(buf, pos)
            value, pos = bytes(buf[pos : pos + size]), pos + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} (field {number})")
        if pos > len(buf):
            raise ValueError("truncated protobuf message")
        out.append((number, wire, value))
    return out


def _ints(wire: int, value: int | bytes) -> list[int]:
    """A repeated integer field's values (packed or not)."""
    if wire == _VARINT:
        return [int(value)]  # type: ignore[arg-type]
    assert isinstance(value, bytes)
    out, pos = [], 0
    while pos < len(value):
        v, pos = _varint(value, pos)
        out.append(v)
    return out


def _tensor(buf: bytes, name: str) -> np.ndarray:
    dense, dtype, shape = None, 0, []
    for number, wire, value in _fields(buf):
        if number == 1:
            dense = value
        elif number == 2:
            raise ValueError(f"loss_fn_inputs[{name!r}]: sparse tensors are not supported (send it dense)")
        elif number == 3:
            dtype = int(value)  # type: ignore[arg-type]
        elif number == 4:
            shape.extend(_ints(wire, value))
    if dtype not in _DTYPES:
        raise ValueError(f"loss_fn_inputs[{name!r}]: unsupported tensor dtype {dtype}")
    arr = np.frombuffer(dense or b"", dtype=_DTYPES[dtype]).copy()
    if shape and int(np.prod(shape)) != arr.size:
        raise ValueError(f"loss_fn_inputs[{name!r}]: shape {shape} does not match its {arr.size} values")
    return arr


def _datum(buf: bytes) -> FwdBwdDatum:
    datum = FwdBwdDatum(tokens=[])
    for number, _, value in _fields(buf):
        assert isinstance(value, bytes) or number not in (1, 2)
        if number == 1:  # Chunk
            for chunk_number, _, chunk in _fields(value):  # type: ignore[arg-type]
                if chunk_number != 1:
                    kind = {2: "image", 3: "audio (dmel)"}.get(chunk_number, f"field {chunk_number}")
                    raise ValueError(f"model_input: {kind} chunks are not supported (text tokens only)")
                tokens = next((v for n, _, v in _fields(chunk) if n == 1), b"")  # type: ignore[arg-type]
                datum.tokens.extend(np.frombuffer(tokens, dtype=np.int32).tolist())  # type: ignore[arg-type]
        elif number == 2:  # map entry: key, Tensor
            entry = {n: v for n, _, v in _fields(value)}  # type: ignore[arg-type]
            name = bytes(entry.get(1, b"")).decode("utf-8")  # type: ignore[arg-type]
            datum.inputs[name] = _tensor(entry.get(2, b""), name)  # type: ignore[arg-type]
        elif number in (3, 4):
            raise ValueError("provenance spans (model_input_spans, loss_fn_input_spans) are not supported")
    return datum


def _config_value(buf: bytes) -> float | str:
    for number, _, value in _fields(buf):
        if number == 1:
            return struct.unpack("<d", int(value).to_bytes(8, "little"))[0]  # type: ignore[arg-type]
        if number == 2:
            return bytes(value).decode("utf-8")  # type: ignore[arg-type]
    return 0.0


def decode_forward_backward(body: bytes) -> FwdBwdRequest:
    """Decode a protobuf ``ForwardBackwardRequest``; ``ValueError`` for a malformed or unsupported one."""
    req = FwdBwdRequest()
    legacy: dict[str, float | str] = {}
    for number, _, value in _fields(body):
        match number:
            case 1:
                req.model_id = bytes(value).decode("utf-8")  # type: ignore[arg-type]
            case 2:
                req.seq_id = int(value)  # type: ignore[arg-type]
            case 3:
                req.data.append(_datum(value))  # type: ignore[arg-type]
            case 4:
                req.loss_fn = bytes(value).decode("utf-8")  # type: ignore[arg-type]
            case 5:
                entry = {n: v for n, _, v in _fields(value)}  # type: ignore[arg-type]
                raw = int(entry.get(2, 0))  # type: ignore[arg-type]
                legacy[bytes(entry.get(1, b"")).decode()] = struct.unpack("<d", raw.to_bytes(8, "little"))[0]  # type: ignore[arg-type]
            case 6:
                req.forward_only = bool(value)
            case 7:
                entry = {n: v for n, _, v in _fields(value)}  # type: ignore[arg-type]
                req.loss_fn_config[bytes(entry.get(1, b"")).decode()] = _config_value(entry.get(2, b""))  # type: ignore[arg-type]
    for key, v in legacy.items():  # the client writes both maps; the typed one wins
        req.loss_fn_config.setdefault(key, v)
    return req


# ---------------------------------------------------------------------------------------------- writing
def _put_varint(out: bytearray, value: int) -> None:
    value &= (1 << 64) - 1
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return


def _put_len(out: bytearray, number: int, payload: bytes) -> None:
    _put_varint(out, (number << 3) | _LEN)
    _put_varint(out, len(payload))
    out.extend(payload)


def _put_int(out: bytearray, number: int, value: int) -> None:
    if value:
        _put_varint(out, (number << 3) | _VARINT)
        _put_varint(out, value)


def _packed(values: list[int]) -> bytes:
    out = bytearray()
    for v in values:
        _put_varint(out, v)
    return bytes(out)


def _batched(arrays: list[np.ndarray]) -> bytes:
    """A ``BatchedTensor`` of 1-D float32 arrays (one per datum): data, byte offsets, dtype."""
    data = [np.ascontiguousarray(a, dtype=np.float32) for a in arrays]
    offsets = np.zeros(len(data) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([a.nbytes for a in data])
    out = bytearray()
    _put_len(out, 1, b"".join(a.tobytes() for a in data))
    _put_len(out, 2, offsets.tobytes())
    _put_int(out, 3, DTYPE_FLOAT32)
    return bytes(out)


def encode_forward_backward_output(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """A protobuf ``ForwardBackwardOutput``: one ``ArrayRecord`` with a field per output name (each
    datum's 1-D float32 array) and the metrics (names ``name:reduction``, as the client folds them)."""
    record = bytearray()
    _put_len(record, 1, b"ArrayRecord")
    names = sorted({name for out in outputs for name in out})
    for name in names:
        entry = bytearray()
        _put_len(entry, 1, name.encode())
        _put_len(entry, 2, _batched([out[name] for out in outputs]))
        _put_len(record, 2, bytes(entry))
    _put_int(record, 3, len(outputs))
    msg = bytearray()
    _put_len(msg, 1, b"ArrayRecord")
    _put_len(msg, 2, bytes(record))
    for key, value in metrics.items():
        entry = bytearray()
        _put_len(entry, 1, key.encode())
        _put_varint(entry, (2 << 3) | _FIXED64)
        entry.extend(struct.pack("<d", float(value)))
        _put_len(msg, 3, bytes(entry))
    return bytes(msg)


def encode_sample_response(sequences: list[SampledSequence], prompt_logprobs: list[float] | None = None) -> bytes:
    """A protobuf ``SampleResponse``: each sequence's stop reason, int32 tokens and float32 log-probs, and
    the prompt's log-probs when asked (float32, NaN where a position is not scored: the first one)."""
    msg = bytearray()
    for seq in sequences:
        item = bytearray()
        _put_int(item, 1, STOP_REASON[seq.stop_reason])
        _put_len(item, 2, np.asarray(seq.tokens, dtype=np.int32).tobytes())
        _put_len(item, 3, np.asarray(seq.logprobs, dtype=np.float32).tobytes())
        _put_len(msg, 1, bytes(item))
    if prompt_logprobs is not None:
        _put_len(msg, 2, np.asarray(prompt_logprobs, dtype=np.float32).tobytes())
    return bytes(msg)


def packed_ints(values: list[int]) -> bytes:
    """Packed varints (the repeated-integer encoding), for tests that build messages by hand."""
    return _packed(values)
