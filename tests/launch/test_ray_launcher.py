"""The Ray launcher on a local Ray instance (CPU): 2 engine actors, 2 FSDP2 trainer ranks (gloo),
2 reward workers. The whole loop runs with the tiny random-init policy:

- versions advance, every step's weights reach both engines, the staleness bound holds;
- an engine actor killed mid-run is restarted: the run completes and the ledger shows no prompt
  lost and no sample trained twice (the same ledger check as the SIGKILL/resume invariant);
- at ``max_staleness=0`` with the same seed, the Ray run and the local launcher's run train on the
  same prompts at every step, with losses that agree.
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from asyncrl.config import load_config
from asyncrl.controller.rundir import read_jsonl
from asyncrl.launch import RunStopped
from asyncrl.launch.local import train
from tests.invariants import test_no_loss_on_resume as ledger_check

pytestmark = pytest.mark.timeout(600)

RAY = [
    "launch.kind=ray",
    "rollout.num_engines=2",
    "launch.trainer_ranks=2",
    "reward.num_workers=2",
    "launch.cpus_per_engine=1",
    "launch.cpus_per_trainer=1",
    "launch.cpus_per_reward_worker=1",
]


def _cfg(model_dir: Path, run_dir: Path, *, eta: int, steps: int, extra: list[str] = ()) -> Any:
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            f"run.run_dir={run_dir}",
            f"controller.max_staleness={eta}",
            f"controller.total_steps={steps}",
            "controller.batch_size=4",
            "controller.max_concurrent=12",
            "rollout.group_size=4",
            "rollout.max_new_tokens=24",
            "rollout.max_slots=32",
            "eval.max_new_tokens=16",
            "task.eval_size=4",
            "task.train_size=300",
            "algo.filter_equal_rewards=false",
            "run.progress=false",
            *extra,
        ],
    )


def _trained_by_step(run_dir: Path) -> dict[int, set[str]]:
    out: dict[int, set[str]] = defaultdict(set)
    for r in read_jsonl(run_dir / "trajectories.jsonl"):
        if r["status"] == "trained":
            out[r["trained_step"]].add(r["prompt_id"])
    return dict(out)


class _InitCalled(Exception):
    pass


def test_a_local_ray_instance_runs_its_workers_at_nice_0(
    tiny_policy_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray's default worker niceness (15) starves engines and trainer ranks beside any other CPU load;
    the launcher starts a local instance with its workers at 0 (a cluster address is left as it is)."""
    from asyncrl.launch import ray as ray_launch

    seen: list[dict[str, Any]] = []

    class FakeRay:
        def is_initialized(self) -> bool:
            return False

        def init(self, address: Any = None, **kwargs: Any) -> None:
            seen.append({"address": address, **kwargs})
            raise _InitCalled

    monkeypatch.setattr(ray_launch, "_ray", lambda: FakeRay())
    with pytest.raises(_InitCalled):
        ray_launch.train_ray(_cfg(tiny_policy_dir, tmp_path / "local", eta=1, steps=1, extra=RAY))
    assert seen[0]["address"] is None and seen[0]["_system_config"] == {"worker_niceness": 0}
    with pytest.raises(_InitCalled):
        ray_launch.train_ray(
            _cfg(tiny_policy_dir, tmp_path / "cluster", eta=1, steps=1, extra=[*RAY, "launch.ray_address=auto"])
        )
    assert seen[1]["address"] == "auto" and "_system_config" not in seen[1]


def test_default_task_on_two_engines_two_ranks_two_reward_workers(
    ray_instance: Any, tiny_policy_dir: Path, tmp_path: Path
) -> None:
    steps, eta = 4, 2
    run_dir, summary = train(_cfg(tiny_policy_dir, tmp_path / "run", eta=eta, steps=steps, extra=RAY))
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["version"] for m in metrics] == list(range(1, steps + 1))  # versions advance
    assert all(math.isfinite(m["loss"]) and m["weight_sync_s"] > 0 for m in metrics)  # sync time per step
    ray_info = summary["ray"]
    assert ray_info["engines"] == 2 and ray_info["trainer_ranks"] == 2 and ray_info["reward_workers"] == 2
    assert ray_info["weight_sync"] == "object_store"
    assert ray_info["engine_classes"] == ["LocalEngine", "LocalEngine"]
    # every step's weights reached both engines (one update per step, none missed)
    assert ray_info["engine_weight_updates"] == [steps, steps]
    assert ray_info["engine_versions"] == [steps, steps]
    assert all(t > 0 for t in ray_info["engine_generated_tokens"])  # both engines served requests
    trained = [r for r in read_jsonl(run_dir / "trajectories.jsonl") if r["status"] == "trained"]
    assert len(trained) == steps * 4 * 4
    for r in trained:
        assert r["trained_step"] - r["min_version"] <= eta
        assert r["min_version"] <= r["max_version"] <= r["trained_step"]
    assert summary["max_staleness_seen"] <= eta
    assert (run_dir / "checkpoint" / "config.json").is_file()  # rank 0 wrote the final model


def test_an_engine_killed_mid_run_is_restarted_and_nothing_is_lost(
    ray_instance: Any, tiny_policy_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncrl.launch.ray as ray_launch

    pools: list[Any] = []
    build = ray_launch._build_engines

    async def capture(*args: Any) -> Any:
        pools.append(await build(*args))
        return pools[-1]

    monkeypatch.setattr(ray_launch, "_build_engines", capture)
    run_dir = tmp_path / "run"
    killed: list[int] = []
    done = threading.Event()  # the run ended: stop watching (no wall-clock deadline a loaded machine can pass)

    def killer() -> None:
        metrics = run_dir / "metrics.jsonl"
        while not done.is_set():
            if metrics.is_file() and len(read_jsonl(metrics)) >= 2 and pools:
                killed.append(len(read_jsonl(metrics)))
                ray_instance.kill(pools[0].engines[0].actor, no_restart=True)  # the process is gone
                return
            time.sleep(0.02)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    cfg = _cfg(
        tiny_policy_dir,
        run_dir,
        eta=ledger_check.ETA,
        steps=ledger_check.STEPS,
        extra=[*RAY, "controller.checkpoint_every=2"],
    )
    try:
        _, summary = train(cfg)
    finally:
        done.set()
    thread.join(timeout=30)
    assert killed and killed[0] < ledger_check.STEPS, "the engine was not killed mid-run"
    assert summary["steps"] == ledger_check.STEPS and summary["stop_reason"] is None
    ray_info = summary["ray"]
    assert ray_info["engine_deaths"] == 1 and ray_info["engine_restarts"] == 1, ray_info
    assert ray_info["engine_versions"] == [ledger_check.STEPS] * 2  # the replacement got the newest weights
    assert summary["engine_failures"] == 0  # every request of the dead engine was served elsewhere
    ledger_check.check_ledger(run_dir)  # every prompt has one fate, nothing trained twice, bound holds


def test_ray_and_local_train_the_same_prompts_with_matching_losses_at_eta0(
    ray_instance: Any, tiny_policy_dir: Path, tmp_path: Path
) -> None:
    steps = 3
    varied = ["task.verifier=custom:tests.launch.rewards:even_length"]  # non-zero advantages on a random policy
    local_dir, _ = train(_cfg(tiny_policy_dir, tmp_path / "local", eta=0, steps=steps, extra=varied))
    ray_dir, _ = train(_cfg(tiny_policy_dir, tmp_path / "ray", eta=0, steps=steps, extra=[*RAY, *varied]))
    assert _trained_by_step(local_dir) == _trained_by_step(ray_dir)
    local = read_jsonl(local_dir / "metrics.jsonl")
    on_ray = read_jsonl(ray_dir / "metrics.jsonl")
    for a, b in zip(local, on_ray, strict=True):
        assert a["trained_tokens"] == b["trained_tokens"], (a["step"], a["trained_tokens"], b["trained_tokens"])
        assert 0.0 < a["reward"] < 1.0 and a["loss"] != 0.0  # a real learning signal, not all zeros
        assert b["reward"] == a["reward"]
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-3, abs=1e-6), (a["step"], a["loss"], b["loss"])
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3), (a["step"], a["grad_norm"], b["grad_norm"])


def test_a_dead_trainer_rank_stops_the_run_with_a_checkpoint_to_resume_from(
    ray_instance: Any, tiny_policy_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncrl.launch.ray as ray_launch

    groups: list[Any] = []
    build = ray_launch._build_trainer

    def capture(*args: Any) -> Any:
        groups.append(build(*args))
        return groups[-1]

    monkeypatch.setattr(ray_launch, "_build_trainer", capture)
    run_dir = tmp_path / "run"
    steps = 8

    stopped = threading.Event()  # the run ended: stop watching (no wall-clock deadline)

    def killer() -> None:
        while not stopped.is_set():
            metrics = run_dir / "metrics.jsonl"
            if metrics.is_file() and len(read_jsonl(metrics)) >= 3 and groups:
                ray_instance.kill(groups[0].ranks[1], no_restart=True)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    extra = [*RAY, "controller.checkpoint_every=2"]
    died = r"trainer rank 1 died.*newest checkpoint is .*step-0000000[2-8].*--resume"
    try:
        with pytest.raises(RunStopped, match=died):
            train(_cfg(tiny_policy_dir, run_dir, eta=1, steps=steps, extra=extra))
    finally:
        stopped.set()
    thread.join(timeout=30)
    done = len(read_jsonl(run_dir / "metrics.jsonl"))
    assert 3 <= done < steps
    _, summary = train(_cfg(tiny_policy_dir, run_dir, eta=1, steps=steps, extra=extra), resume=True)
    assert summary["steps"] == steps and summary["resumes"] == 1 and summary["max_staleness_seen"] <= 1


def test_engines_as_http_servers_with_weights_through_disk(
    ray_instance: Any, tiny_policy_dir: Path, tmp_path: Path
) -> None:
    extra = [
        "launch.kind=ray",
        "rollout.num_engines=2",
        "launch.engine_mode=server",
        "launch.weight_sync=disk",
        f"trainer.weight_export_dir={tmp_path / 'exports'}",
        "reward.num_workers=1",
    ]
    run_dir, summary = train(_cfg(tiny_policy_dir, tmp_path / "run", eta=1, steps=3, extra=extra))
    assert summary["steps"] == 3 and summary["ray"]["weight_sync"] == "disk"
    assert summary["ray"]["engine_versions"] == [3, 3]  # both servers loaded every version from disk
    assert all(t > 0 for t in summary["ray"]["engine_generated_tokens"])
    assert any((tmp_path / "exports").iterdir())


def test_served_engine_actor_needs_the_run_key(ray_instance: Any, tiny_policy_dir: Path, tmp_path: Path) -> None:
    import json
    import urllib.error
    import urllib.request

    from asyncrl.launch.ray import ServeAuth
    from asyncrl.launch.ray_actors import EngineWorker

    cfg = load_config(None, [f"model.path={tiny_policy_dir}", f"trainer.weight_export_dir={tmp_path / 'exports'}"])
    auth, other = ServeAuth.for_run(cfg), ServeAuth.for_run(cfg)
    assert auth.api_key != other.api_key and auth.api_key not in repr(auth) and not auth.temporary
    assert auth.weights_root == str((tmp_path / "exports").resolve())
    actor = ray_instance.remote(EngineWorker).options(num_cpus=1).remote(str(tiny_policy_dir), cfg)
    url = ray_instance.get(actor.serve.remote(auth.api_key, auth.weights_root), timeout=120)

    def call(path: str, key: str | None, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url + path, data=data, headers=headers, method="POST" if data else "GET")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    try:
        assert call("/model_info", None)[0] == 401 and call("/model_info", other.api_key)[0] == 401
        status, info = call("/model_info", auth.api_key)
        assert status == 200 and info["weights_root"] == auth.weights_root
        assert call("/update_weights_from_disk", auth.api_key, {"model_path": str(tiny_policy_dir)})[0] == 403
    finally:
        ray_instance.kill(actor, no_restart=True)


def test_reward_workers_score_every_verifier_and_a_dead_one_is_replaced(ray_instance: Any) -> None:
    import asyncio

    from asyncrl.launch.ray_actors import RewardWorker
    from asyncrl.launch.ray_clients import RayRewardPool

    cfg = load_config(None, [])
    remote_cls = ray_instance.remote(RewardWorker)
    pool = RayRewardPool(lambda i: remote_cls.options(num_cpus=0.1).remote(cfg), 2)

    async def run() -> list[Any]:
        first = await pool.score("arithmetic", "3+9=12 #12", "12")
        ray_instance.kill(pool.workers[0], no_restart=True)
        ray_instance.kill(pool.workers[1], no_restart=True)
        await asyncio.sleep(0.5)
        after = await asyncio.gather(
            pool.score("arithmetic", "3+4=7 #7", "8"), pool.score("math", "The answer is \\boxed{42}.", "42")
        )
        await pool.close()
        return [first, *after]

    first, wrong, math = asyncio.run(run())
    assert (first.reward, first.failure) == (1.0, None)
    assert (wrong.reward, wrong.failure) == (0.0, None)
    assert (math.reward, math.failure) == (1.0, None)
    assert pool.replaced == 2


def test_the_summary_names_an_engine_actors_class_and_a_dead_one_as_dead(ray_instance: Any) -> None:
    import asyncio

    from asyncrl.launch.ray_clients import RayEngineClient

    @ray_instance.remote
    class StubEngineWorker:
        def engine_class(self) -> str:
            return "StubEngine"

    actor = StubEngineWorker.remote()
    client = RayEngineClient(actor, 0)
    assert asyncio.run(client.fetch_engine_class()) == "StubEngine"
    ray_instance.kill(actor, no_restart=True)
    # ray.kill returns before the actor is gone: a call made at once can still be answered by it
    for _ in range(200):
        answer = asyncio.run(client.fetch_engine_class())
        if answer != "StubEngine":
            break
        time.sleep(0.05)
    assert answer == "dead"  # the run's summary is still written
