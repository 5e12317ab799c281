"""Typed dataclasses from YAML mappings and ``key=value`` overrides: the generic half of the config.

``apply_mapping(node, data, prefix)`` returns a copy of a (frozen) dataclass tree with the fields of a
nested mapping set, checking each value against its field's annotation (bool, int, float, str,
``Literal`` choices, optional, fixed tuples) and rejecting unknown keys with the valid ones listed;
``check_choices`` checks every ``Literal``-typed field of a tree built in code; ``parse_override("a.b=v")``
reads the value as YAML and ``nest`` turns the dotted key into a mapping. Every error is a
``ConfigError`` that names the key. ``config.tree`` owns the tree itself, ``config.checks`` its validation,
``asyncrl.choices`` the ``Literal`` aliases. No torch, no other asyncrl module.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import yaml

__all__ = ["ConfigError", "apply_mapping", "check_choices", "nest", "parse_override", "read_yaml"]

T = typing.TypeVar("T")


class ConfigError(ValueError):
    """A config file or override that cannot be applied (unknown key, wrong type, bad value)."""


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check/convert ``value`` against a field annotation; raise ConfigError naming the key."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{key}: bad value {value!r}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{key}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, key) for v, a in zip(value, args, strict=True))
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "2e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if annotation is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if origin is typing.Literal:
        if value in args:
            return value
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(str, args))}")
    raise ConfigError(f"{key}: unsupported field type {annotation!r}")


def apply_mapping(node: T, data: dict[str, Any], prefix: str) -> T:
    """A copy of the dataclass tree ``node`` with the fields that the nested mapping ``data`` names set
    (each value checked against its field's annotation); ``node`` itself is not changed."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(type(node))
    names = [f.name for f in dataclasses.fields(node)]
    changes: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(f"unknown config key '{dotted}'. Valid keys here: {', '.join(prefix + n for n in names)}")
        current = getattr(node, key)
        if dataclasses.is_dataclass(current):
            changes[key] = apply_mapping(current, value, f"{dotted}.")
        else:
            changes[key] = _coerce(value, hints[key], dotted)
    return dataclasses.replace(node, **changes)


def _choices(annotation: Any) -> tuple[Any, ...] | None:
    """The values a ``Literal`` (or optional ``Literal``) annotation allows; None for other types."""
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        literals = [_choices(arg) for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(literals) == 1 and literals[0] is not None:
            return (*literals[0], None)
    return None


def check_choices(node: Any, prefix: str) -> None:
    """Check every field of the dataclass tree ``node`` typed with a ``Literal`` alias against the
    alias itself (``typing.get_args``); the error names the dotted key and the valid values. Covers
    configs built in code, which ``apply_mapping`` never saw."""
    hints = typing.get_type_hints(type(node))
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            check_choices(value, f"{prefix}{f.name}.")
            continue
        valid = _choices(hints[f.name])
        if valid is not None and value not in valid:
            shown = ", ".join("null" if v is None else str(v) for v in valid)
            raise ConfigError(f"{prefix}{f.name}: {value!r} is not one of {shown}")


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping in the YAML file ``path`` (empty for an empty file)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    try:
        return yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {p} is not valid YAML: {exc}") from exc


def parse_override(text: str) -> tuple[str, Any]:
    """Parse ``a.b=value`` (value as YAML) into ``("a.b", value)``."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not of the form key=value (e.g. controller.max_staleness=2)")
    key, raw = text.split("=", 1)
    key = key.strip()
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override '{text}': cannot parse value: {exc}") from exc
    return key, value


def nest(key: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cursor = out
    parts = key.split(".")
    for part in parts[:-1]:
        cursor = cursor.setdefault(part, {})
    cursor[parts[-1]] = value
    return out


def finite_float(text: str) -> float:
    """An ``argparse`` type for a command-line number that must be finite (argparse's ``float`` reads
    ``nan`` and ``inf``): the error names the value, and argparse prints it in one line."""
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value
