"""asyncrl.rollout (see DESIGN.md §2): engines (LocalEngine, RemoteEngine), the interruptible
generation loop, the engine server, batch generation and workflows.

Names are imported lazily so that ``import asyncrl.rollout.workflow`` does not pull in torch."""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "LocalEngine": "asyncrl.rollout.engine",
    "SamplingParams": "asyncrl.rollout.sampling",
    "generate_group": "asyncrl.rollout.interruptible",
    "RemoteEngine": "asyncrl.rollout.remote",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'asyncrl.rollout' has no attribute {name!r}")
