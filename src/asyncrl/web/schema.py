"""Request bodies as typed schemas: a frozen dataclass per body, read and checked in one place
(:func:`parse_body`), so that a route handler receives typed fields and never probes a ``dict``.

A schema's fields are annotated with their JSON types: ``str``, ``int`` (never a bool), ``float`` (a
finite number: JSON as Python reads it carries ``NaN`` and ``Infinity``; an int is read as a float),
``bool``, ``dict``, ``list[X]``, ``Literal[...]``, another schema (a nested object), ``Any``, and unions
of these (``X | None``: null allowed). ``Annotated[T, Spec(...)]`` adds what the type cannot say: a
condition on the value (``check``), a reader of its own (``convert``, e.g. an int or the string of one)
and the words of the message (``what``). A field without a default is required.

Every bad field gets one message naming it (``'sampling_params.top_p' must be a number in (0, 1], got
2``), and the 400 carries them all (:class:`SchemaError`). Keys the schema does not name are refused
with the list of those it does, unless the schema says ``unknown_fields = "ignore"`` (a protocol whose
clients send more than this server reads, e.g. SGLang's ``/generate``).

Imports ``checks`` only; no third-party validation library.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from asyncrl.web.checks import HTTPError, is_finite, is_int

__all__ = ["SchemaError", "Spec", "parse_body"]

T = TypeVar("T")


@dataclass(frozen=True)
class Spec:
    """What a field's type cannot say (``Annotated[T, Spec(...)]``)."""

    what: str | None = None
    """What the message says the field must be (default: said by its type)."""
    check: Callable[[Any], bool] | None = None
    """A condition on the value once it has its type."""
    convert: Callable[[Any], Any] | None = None
    """Reads the raw JSON value itself, instead of the type (raises ``ValueError`` when it cannot)."""


class SchemaError(HTTPError):
    """A body that does not fit its schema: 400, one message per bad field (``problems``)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(400, "; ".join(problems))
        self.problems = tuple(problems)


class _Bad(Exception):
    """A value that does not fit its type (internal to ``_read``)."""


def parse_body(schema: type[T], data: Any, *, where: str = "") -> T:
    """``data`` (parsed JSON) read into ``schema``; raises :class:`SchemaError` naming every bad field.
    ``where``: the dotted path of ``data`` in the request (for nested schemas' messages)."""
    problems: list[str] = []
    value = _object(schema, data, where, problems)
    if problems:
        raise SchemaError(problems)
    return value


def _object(schema: type[T], data: Any, where: str, problems: list[str]) -> T:
    if not isinstance(data, dict):
        problems.append(f"{_name(where) if where else 'the request body'} must be a JSON object, got {_short(data)}")
        return None  # type: ignore[return-value]
    fields = _fields(schema)
    known = {f.name for f in fields}
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown and getattr(schema, "unknown_fields", "refuse") != "ignore":
        problems.append(f"unsupported {_name(where) if where else 'fields'} {unknown}; supported: {sorted(known)}")
    values: dict[str, Any] = {}
    hints = _hints(schema)
    for f in fields:
        path = f"{where}.{f.name}" if where else f.name
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                problems.append(f"{_name(path)} is required")
            continue
        kind, spec = _split(hints[f.name])
        raw = data[f.name]
        try:
            values[f.name] = _field(kind, spec, raw, path, problems)
        except _Bad:
            what = spec.what if spec is not None and spec.what else _describe(kind)
            problems.append(f"{_name(path)} must be {what}, got {_short(raw)}")
    if problems:
        return None  # type: ignore[return-value]
    return schema(**values)


def _field(kind: Any, spec: Spec | None, raw: Any, path: str, problems: list[str]) -> Any:
    if spec is not None and spec.convert is not None:
        try:
            return spec.convert(raw)
        except (ValueError, TypeError):
            raise _Bad from None
    value = _read(kind, raw, path, problems)
    if spec is not None and spec.check is not None and value is not None and not spec.check(value):
        raise _Bad
    return value


def _read(kind: Any, raw: Any, path: str, problems: list[str]) -> Any:
    """``raw`` as ``kind``; raises ``_Bad`` (a nested schema reports its own fields into ``problems``)."""
    origin = get_origin(kind)
    if kind is Any:
        return raw
    if origin in (Union, types.UnionType):
        if raw is None and type(None) in get_args(kind):
            return None
        options = [option for option in get_args(kind) if option is not type(None)]
        if len(options) == 1:  # X | None: X's own messages (a nested schema names its fields)
            return _read(options[0], raw, path, problems)
        for option in options:
            try:
                return _read(option, raw, path, [])
            except _Bad:
                continue
        raise _Bad
    if origin is Literal:
        if any(raw == v and type(raw) is type(v) for v in get_args(kind)):
            return raw
        raise _Bad
    if origin is list:
        (item,) = get_args(kind) or (Any,)
        if not isinstance(raw, list):
            raise _Bad
        return [_read(item, v, path, problems) for v in raw]
    if dataclasses.is_dataclass(kind):
        nested: list[str] = []
        value = _object(kind, raw, path, nested)  # type: ignore[arg-type]
        if nested:
            problems.extend(nested)
            return None
        return value
    if kind is dict or origin is dict:
        if isinstance(raw, dict):
            return raw
        raise _Bad
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        raise _Bad
    if kind is int:
        if is_int(raw):
            return raw
        raise _Bad
    if kind is float:
        if is_finite(raw):
            return float(raw)
        raise _Bad
    if kind is str:
        if isinstance(raw, str):
            return raw
        raise _Bad
    raise TypeError(f"a schema field of type {kind!r} is not supported")


def _describe(kind: Any) -> str:
    """What a value of ``kind`` is, in a message's words."""
    origin = get_origin(kind)
    if kind is Any:
        return "any value"
    if origin in (Union, types.UnionType):
        return " or ".join("null" if k is type(None) else _describe(k) for k in get_args(kind))
    if origin is Literal:
        return "one of " + ", ".join(repr(v) for v in get_args(kind))
    if origin is list:
        (item,) = get_args(kind) or (Any,)
        return f"a list of {_plural(_describe(item))}"
    if dataclasses.is_dataclass(kind) or kind is dict or origin is dict:
        return "an object"
    return {bool: "a bool", int: "an integer", float: "a finite number", str: "a string"}.get(kind, repr(kind))


def _plural(described: str) -> str:
    for article in ("an ", "a "):
        if described.startswith(article):
            return described[len(article) :] + "s"
    return described


def _split(hint: Any) -> tuple[Any, Spec | None]:
    if get_origin(hint) is Annotated:
        kind, *extras = get_args(hint)
        return kind, next((e for e in extras if isinstance(e, Spec)), None)
    return hint, None


@functools.cache
def _fields(schema: type) -> tuple[dataclasses.Field, ...]:
    if not dataclasses.is_dataclass(schema):
        raise TypeError(f"{schema!r} is not a dataclass schema")
    return dataclasses.fields(schema)


@functools.cache
def _hints(schema: type) -> dict[str, Any]:
    return get_type_hints(schema, include_extras=True)


def _name(path: str) -> str:
    return f"'{path}'"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
