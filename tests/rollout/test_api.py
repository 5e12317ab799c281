"""``RolloutEngine``: every engine variant satisfies the protocol, and an engine that answers a group
at once refuses a per-sample callback instead of dropping it."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.rollout.api import RolloutEngine
from asyncrl.rollout.engine import LocalEngine
from asyncrl.rollout.pool import EnginePool
from asyncrl.rollout.remote import RemoteEngine
from asyncrl.rollout.sampling import SamplingParams
from tests.protocol_check import protocol_members, protocol_problems
from tests.rollout.test_pool import FakeEngine

ENGINE_MEMBERS = {
    "version",
    "reports_each_sample",
    "start",
    "generate",
    "update_weights",
    "pause",
    "resume",
    "abort_all",
    "stats",
    "close",
}


def _ray_clients() -> list[type]:
    pytest.importorskip("ray")
    from asyncrl.launch.ray_clients import RayEngineClient, ServedEngineClient

    return [RayEngineClient, ServedEngineClient]


def test_the_protocol_declares_exactly_what_its_callers_use() -> None:
    assert set(protocol_members(RolloutEngine)) == ENGINE_MEMBERS


@pytest.mark.parametrize("cls", [LocalEngine, RemoteEngine, EnginePool])
def test_engines_satisfy_the_protocol(cls: type) -> None:
    assert protocol_problems(cls, RolloutEngine) == []


def test_ray_engine_clients_satisfy_the_protocol() -> None:
    for cls in _ray_clients():
        assert protocol_problems(cls, RolloutEngine) == [], cls.__name__


def test_instances_pass_a_runtime_check() -> None:
    ray_client, served_client = _ray_clients()
    remote = RemoteEngine("http://127.0.0.1:9")  # no connection is made until a request
    pool = EnginePool([remote])
    for engine in (remote, pool, ray_client(actor=None, index=0), served_client("http://127.0.0.1:9", None, 0, "key")):
        assert isinstance(engine, RolloutEngine)
        assert engine.reports_each_sample is False
    assert LocalEngine.reports_each_sample is True
    assert not isinstance(FakeEngine("x"), RolloutEngine)  # a partial fake is told apart


def test_a_group_at_once_engine_refuses_on_sample_done() -> None:
    pool = EnginePool([FakeEngine("a")])
    sampling = SamplingParams(max_new_tokens=4)
    with pytest.raises(ValueError, match="reports_each_sample is False"):
        asyncio.run(pool.generate([1, 2], sampling, 2, on_sample_done=lambda i: None))
    assert len(asyncio.run(pool.generate([1, 2], sampling, 2))) == 2


def test_the_check_names_what_a_partial_engine_lacks() -> None:
    problems = protocol_problems(FakeEngine, RolloutEngine)  # the pool test's fake: generate, update, stats, close
    assert "generate: parameter 4 must be 'on_sample_done'" in problems
    assert {p.split(":")[0] for p in problems} == {
        "generate",
        "reports_each_sample",
        "start",
        "pause",
        "resume",
        "abort_all",
    }
