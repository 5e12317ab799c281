"""``Workflow``: the single-turn episode function and both multi-turn workflows satisfy the protocol the
controller calls (same parameters in the same order, async, the per-sample callback optional)."""

from __future__ import annotations

import inspect

import pytest

from asyncrl.rollout.agent import AgentWorkflow
from asyncrl.rollout.openai_workflow import OpenAIAgentWorkflow
from asyncrl.rollout.workflow import Workflow, run_episode
from tests.protocol_check import protocol_problems


@pytest.mark.parametrize("cls", [AgentWorkflow, OpenAIAgentWorkflow])
def test_multi_turn_workflows_satisfy_the_protocol(cls: type) -> None:
    assert protocol_problems(cls, Workflow) == []


def test_run_episode_has_the_protocols_signature() -> None:
    want = list(inspect.signature(Workflow.__call__).parameters.values())[1:]  # less self
    got = list(inspect.signature(run_episode).parameters.values())
    assert [(p.name, p.default) for p in got] == [(p.name, p.default) for p in want]
    assert inspect.iscoroutinefunction(run_episode)


def test_a_mismatched_workflow_is_found() -> None:
    class TwoArgs:
        async def __call__(self, engine, prompt):  # noqa: ANN001, ANN204
            raise AssertionError

    assert protocol_problems(TwoArgs, Workflow) != []
