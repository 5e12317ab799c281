"""User-defined reward functions named in the config as ``pkg.module:function``.

The function is imported in the reward worker process (so a crash or a hang cannot take the
trainer down; the service kills and replaces the worker) and called as
``function(prompt, completion, row)`` where ``row`` is the dataset row (with ``reference`` added
when absent). It returns a number or a bool; a coroutine function is awaited. Anything else, a
non-finite number or an exception is the verifier's error, reported as a failure, never a 0.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
import numbers
import re
from collections.abc import Callable
from typing import Any

_SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
_loaded: dict[str, Callable[..., Any]] = {}


def import_callable(spec: str, what: str) -> Callable[..., Any]:
    """The callable ``pkg.module:function`` names (the attribute may be dotted, e.g. ``mod:Class.method``);
    ``what`` names it in the error (``custom reward``, ``rollout.workflow=``, ...). Also used by
    ``launch.stages`` for the workflow and agent entry points of the config."""
    module_name, _, attr_path = spec.partition(":")
    obj: Any = importlib.import_module(module_name)
    for attr in attr_path.split("."):
        obj = getattr(obj, attr)
    if not callable(obj):
        raise TypeError(f"{what}{spec!r} is not callable")
    return obj


def load_custom_reward(spec: str) -> Callable[..., Any]:
    """Import ``pkg.module:function`` once per process (``import_callable``)."""
    if not _SPEC.fullmatch(spec):
        raise ValueError(f"custom reward {spec!r} is not of the form pkg.module:function")
    fn = _loaded.get(spec)
    if fn is None:
        fn = _loaded[spec] = import_callable(spec, "custom reward ")
    return fn


def to_reward(value: Any, spec: str = "custom reward") -> float:
    """Check and convert a custom function's return value."""
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, numbers.Real):
        raise TypeError(f"{spec} returned {type(value).__name__}, expected a number or bool")
    reward = float(value)
    if not math.isfinite(reward):
        raise ValueError(f"{spec} returned a non-finite reward {reward!r}")
    return reward


def call_custom_reward(spec: str, prompt: str, completion: str, row: dict[str, Any]) -> float:
    """Call the named function and return its reward as a float."""
    value = load_custom_reward(spec)(prompt, completion, row)
    if inspect.isawaitable(value):

        async def wait() -> Any:
            return await value

        value = asyncio.run(wait())
    return to_reward(value, spec)
