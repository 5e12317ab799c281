"""The training service on a free port, driven by the official ``tinker`` client (docs/tinker.md)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncrl.service import EngineSpec, ServiceThread

pytest.importorskip("tinker")

API_KEY = "tml-asyncrl-test-key"
"""The client only sends keys that begin with ``tml-``."""
BASE = "tiny"


@pytest.fixture(scope="session", autouse=True)
def _no_client_telemetry() -> Iterator[None]:
    """The client would post its telemetry to the service (accepted and dropped); keep the logs quiet."""
    old = os.environ.get("TINKER_TELEMETRY")
    os.environ["TINKER_TELEMETRY"] = "0"
    yield
    if old is None:
        os.environ.pop("TINKER_TELEMETRY", None)
    else:
        os.environ["TINKER_TELEMETRY"] = old


def start_service(tiny_policy_dir: Path, root: Path) -> ServiceThread:
    """A service of the tiny model with its runs under ``root`` (the caller enters and exits it)."""
    return ServiceThread(
        {BASE: tiny_policy_dir}, root, api_key=API_KEY, engine=EngineSpec(max_slots=8, max_seq_len=160), poll_s=0.5
    )


@pytest.fixture(scope="module")
def service(tiny_policy_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceThread]:
    with start_service(tiny_policy_dir, tmp_path_factory.mktemp("tinker_root")) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(service: ServiceThread) -> Iterator[object]:
    import tinker

    sc = tinker.ServiceClient(base_url=service.url, api_key=API_KEY)
    yield sc
    sc.close("success").result()
