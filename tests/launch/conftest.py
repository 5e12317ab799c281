"""A local Ray instance for the launcher tests (started once per session; skipped without Ray)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def ray_instance() -> Any:
    ray = pytest.importorskip("ray")
    # 8 logical CPUs on a 2-core box: 2 engines + 2 trainer ranks + 2 reward workers fit; Ray's
    # CPUs are scheduling units, the processes share the real cores.
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
