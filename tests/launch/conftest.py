"""A local Ray instance for the launcher tests (started once per session; skipped without Ray)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.repo_paths import REPO


@pytest.fixture(scope="session")
def ray_instance() -> Any:
    ray = pytest.importorskip("ray")
    # Actors and reward workers import test helpers (tests.launch.rewards): they inherit this.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    # 8 logical CPUs on a 2-core box: 2 engines + 2 trainer ranks + 2 reward workers fit; Ray's
    # CPUs are scheduling units, the processes share the real cores.
    # Workers at nice 0, as the launcher starts a local instance (Ray's default, 15, starves them
    # beside any other CPU load).
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, _system_config={"worker_niceness": 0})
    yield ray
    ray.shutdown()
