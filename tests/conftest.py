"""Session fixtures shared by all test folders: the tiny policy, built locally once."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.models import build_tiny_policy


@pytest.fixture(scope="session")
def tiny_policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-init tiny Llama + character tokenizer saved like a real checkpoint."""
    return build_tiny_policy(tmp_path_factory.mktemp("tiny_policy_shared"))
