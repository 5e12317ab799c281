"""Loading a config: YAML files and ``--set key=value`` overrides over the defaults, validated once.

A YAML file overrides any subset of the tree; ``--set a.b=v`` overrides single fields (the value is
parsed as YAML: ``4``, ``0.5``, ``true``, ``null``, ``[1, 2]``). Unknown keys and values of the wrong
type are errors that name the key and the valid choices (the generic parsing is ``config.parse``, the
checks ``config.checks``). The tree is frozen: a changed config is a new one (``with_values(cfg,
{"model.path": p})``, checked and validated like an override, or ``dataclasses.replace``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from asyncrl.config.checks import validate
from asyncrl.config.parse import apply_mapping, nest, parse_override, read_yaml
from asyncrl.config.tree import Config


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain nested dicts (for YAML/JSON dumps)."""
    return dataclasses.asdict(cfg)


def dump_yaml(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML (tuples as lists)."""
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def load_config(
    path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (), *, base: str | Path | None = None
) -> Config:
    """Defaults, then the YAML file ``base`` (if any: the saved ``config.yaml`` of a run that is
    resumed), then the YAML file ``path`` on top of it (if any: only the keys it holds change),
    then each ``key=value`` override; validated once, at the end."""
    cfg = Config()
    for layer in (base, path):
        if layer is not None:
            cfg = apply_mapping(cfg, read_yaml(layer), "")
    for text in overrides:
        key, value = parse_override(text)
        cfg = apply_mapping(cfg, nest(key, value), "")
    return validate(cfg)


def with_values(cfg: Config, values: Mapping[str, Any]) -> Config:
    """A copy of ``cfg`` with the dotted keys of ``values`` set (``{"model.path": "ckpt"}``), each value
    checked like a ``--set`` override and the result validated; ``cfg`` itself is frozen and unchanged."""
    for key, value in values.items():
        cfg = apply_mapping(cfg, nest(key, value), "")
    return validate(cfg)
