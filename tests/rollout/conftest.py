"""Fixtures for the rollout tests: the tiny policy built once per session, fresh copies per test."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from asyncrl.models import build_tiny_policy, load_policy


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("tiny_policy"))


@pytest.fixture
def load_tiny(tiny_dir: Path) -> Callable[[], tuple[Any, Any]]:
    """A factory of fresh (model, tokenizer) pairs (engines own and may update their model)."""
    return lambda: load_policy(tiny_dir)


@pytest.fixture
def arun() -> Callable[[Any], Any]:
    """Run a coroutine to completion with a timeout (no pytest-asyncio in the venv)."""
    return lambda coro: asyncio.run(asyncio.wait_for(coro, timeout=60))
