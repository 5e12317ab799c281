"""``trainer.distributed.run_trainer_worker`` on a scripted leader (no process group): the follower is built
from the ``init`` payload by the factory it is given, runs each command through ``Follower.follow`` and
counts the training steps; a command before ``init`` is an error. ``Trainer.follow`` refuses an unknown
command."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from asyncrl.trainer.distributed import DistContext, run_trainer_worker
from asyncrl.trainer.trainer import Trainer


class _ScriptedLeader(DistContext):
    """Rank 1 of two; each ``broadcast_object`` returns the leader's next command."""

    def __init__(self, commands: list[tuple[str, Any]]) -> None:
        super().__init__(rank=1, world_size=2, device=torch.device("cpu"))
        self.commands = iter(commands)

    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        return next(self.commands)


class _Recorder:
    def __init__(self, payload: dict[str, Any]) -> None:
        self.payload = payload
        self.calls: list[tuple[str, Any]] = []

    def follow(self, name: str, payload: Any) -> None:
        self.calls.append((name, payload))


def test_the_follower_is_built_by_the_factory_and_mirrors_each_command() -> None:
    built: list[_Recorder] = []

    def make(payload: dict[str, Any]) -> _Recorder:
        built.append(_Recorder(payload))
        return built[-1]

    script = [
        ("init", {"arch": "tiny"}),
        ("train_step", 1),
        ("compute_logprobs", 2),
        ("train_step", 3),
        ("save_checkpoint", {"directory": "d"}),
        ("stop", None),
    ]
    assert run_trainer_worker(make, _ScriptedLeader(script)) == 2
    (follower,) = built
    assert follower.payload == {"arch": "tiny"} and follower.calls == script[1:-1]


def test_a_command_before_init_is_refused() -> None:
    with pytest.raises(RuntimeError, match="before init"):
        run_trainer_worker(_Recorder, _ScriptedLeader([("train_step", 1)]))
    with pytest.raises(RuntimeError, match="non-zero rank"):
        run_trainer_worker(_Recorder, None)  # no process group


def test_trainer_follow_refuses_an_unknown_command() -> None:
    trainer = Trainer.__new__(Trainer)  # follow dispatches before touching any state
    with pytest.raises(RuntimeError, match="unknown command 'reboot'"):
        trainer.follow("reboot", None)
