"""Fixtures shared by the integration tests."""

from __future__ import annotations

import pytest

import asyncrl.controller.loop as loop_module
from asyncrl.types import Group, TrainSample


@pytest.fixture
def trained_batches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[Group], list[TrainSample]]]:
    """Every batch the controller hands the trainer in this test: (its groups, the samples built from them)."""
    batches: list[tuple[list[Group], list[TrainSample]]] = []

    def recording(groups, *args, **kwargs):  # what the trainer is handed
        samples = loop_module.groups_to_samples.__wrapped__(groups, *args, **kwargs)
        batches.append((list(groups), samples))
        return samples

    recording.__wrapped__ = loop_module.groups_to_samples  # type: ignore[attr-defined]
    monkeypatch.setattr(loop_module, "groups_to_samples", recording)
    return batches
