"""Typed dataclasses from YAML mappings and ``key=value`` overrides: the generic half of the config.

``apply_mapping(node, data, prefix)`` sets the fields of a dataclass tree from a nested mapping,
checking each value against its field's annotation (bool, int, float, str, optional, fixed
tuples) and rejecting unknown keys with the valid ones listed; ``parse_override("a.b=v")`` reads
the value as YAML and ``nest`` turns the dotted key into a mapping. Every error is a
``ConfigError`` that names the key. ``asyncrl.config`` owns the tree itself, its choices and
validation. No torch, no other asyncrl module.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import yaml

__all__ = ["ConfigError", "apply_mapping", "nest", "parse_override"]


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


def apply_mapping(node: Any, data: dict[str, Any], prefix: str) -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(type(node))
    names = [f.name for f in dataclasses.fields(node)]
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(f"unknown config key '{dotted}'. Valid keys here: {', '.join(prefix + n for n in names)}")
        current = getattr(node, key)
        if dataclasses.is_dataclass(current):
            apply_mapping(current, value, f"{dotted}.")
        else:
            setattr(node, key, _coerce(value, hints[key], dotted))


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
