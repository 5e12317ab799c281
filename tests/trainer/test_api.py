"""``PolicyTrainer``: the in-process, child-process and Ray trainers satisfy the protocol."""

from __future__ import annotations

import pytest

from asyncrl.launch.trainer_process import TrainerProcess
from asyncrl.trainer.api import PolicyTrainer, TrainStepResult
from asyncrl.trainer.trainer import StepResult, Trainer
from tests.protocol_check import protocol_members, protocol_problems


def test_the_protocol_declares_exactly_what_the_controller_and_runner_use() -> None:
    assert set(protocol_members(PolicyTrainer)) == {
        "version",
        "train_step",
        "export_weights",
        "save_checkpoint",
        "load_checkpoint",
        "save_pretrained",
    }
    assert set(protocol_members(TrainStepResult)) == {"version", "applied", "metrics"}


@pytest.mark.parametrize("cls", [Trainer, TrainerProcess])
def test_trainers_satisfy_the_protocol(cls: type) -> None:
    assert protocol_problems(cls, PolicyTrainer) == []


def test_the_ray_trainer_group_satisfies_the_protocol() -> None:
    pytest.importorskip("ray")
    from asyncrl.launch.ray_clients import RayTrainerGroup

    assert protocol_problems(RayTrainerGroup, PolicyTrainer) == []
    assert isinstance(RayTrainerGroup([], "tensors", 3), PolicyTrainer)  # no rank is called


def test_a_step_result_satisfies_its_protocol() -> None:
    assert isinstance(StepResult(version=1, applied=True, metrics={}), TrainStepResult)
    assert protocol_problems(StepResult, TrainStepResult) == []
