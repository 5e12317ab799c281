"""RewardService: routing, verdicts vs failures, timeouts with worker replacement, retries,
cache, metrics, and hostile code through the pool."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncrl.reward.service import RewardResult, RewardScorer, RewardService, resolve_verifier
from tests.protocol_check import protocol_problems

from .hostile import HOSTILE, TESTS, sandbox_processes

HANG_S = 30.0
"""How long a test waits before it calls a request hung. Never a speed limit: on a loaded 2-core machine a
worker's or a sandbox's interpreter may take seconds to start; what a test checks is counted (timeouts,
workers killed, processes left), which the load does not change. Under the 60 s that the hostile
``setsid_daemon`` sleeps, so a sandbox that is not stopped at its wall clock still fails."""

CUSTOM = textwrap.dedent(
    """
    import os, time
    from asyncrl.reward import InfrastructureError

    CALLS = []

    def exact(prompt, completion, row):
        return completion.strip() == row["reference"]

    def uses_row(prompt, completion, row):
        return float(len(prompt) + row["bonus"])

    def boom(prompt, completion, row):
        raise RuntimeError("boom")

    def die(prompt, completion, row):
        os._exit(3)

    def hang(prompt, completion, row):
        time.sleep(1000)

    def nan(prompt, completion, row):
        return float("nan")

    def text(prompt, completion, row):
        return "1.0"

    def flaky_infra(prompt, completion, row):
        marker = row["marker"]
        if not os.path.exists(marker):
            open(marker, "w").close()
            raise InfrastructureError("transient")
        return 1.0

    async def coro(prompt, completion, row):
        return 0.5
    """
)


@pytest.fixture(scope="module", autouse=True)
def custom_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A user module importable by name in the workers (they inherit sys.path)."""
    path = tmp_path_factory.mktemp("custom")
    (path / "asyncrl_test_rewards.py").write_text(CUSTOM)
    sys.path.insert(0, str(path))
    yield "asyncrl_test_rewards"
    sys.path.remove(str(path))


def run(coro: Any, timeout: float = 120) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_resolve_verifier_is_strict() -> None:
    for name in ("math", "code", "arithmetic", "custom:a.b:c", "remote:http://127.0.0.1:1"):
        resolve_verifier(name)
    for bad in ("", "Math", "custom:", "custom:nocolon", "custom:a:b:c", "remote:ftp://x", "python"):
        with pytest.raises(ValueError):
            resolve_verifier(bad)


def test_math_verdicts_cache_and_metrics() -> None:
    async def main() -> None:
        async with RewardService(num_workers=2, timeout_s=10) as svc:
            assert svc.metrics()["workers_started"] == 0  # lazy
            right = await svc.score("math", "so \\boxed{1,234}", "1234")
            wrong = await svc.score("math", "so \\boxed{1,235}", "1234")
            again = await svc.score("math", "so \\boxed{1,234}", "1234")
            assert (right.reward, right.failure, right.cached) == (1.0, None, False)
            assert (wrong.reward, wrong.failure) == (0.0, None)
            assert again.cached and again.reward == 1.0
            m = svc.metrics()
            assert m["cache_hits"] == 1 and m["verdicts"] == 3 and m["failures"] == 0
            assert m["retries"] == 0 and m["workers_started"] >= 1
            assert m["latency_p50_s"] > 0 and m["latency_p99_s"] >= m["latency_p50_s"]

    run(main())


def test_identical_requests_in_flight_are_computed_once() -> None:
    async def main() -> None:
        async with RewardService(num_workers=2, timeout_s=10, preload=()) as svc:
            results = await asyncio.gather(*(svc.score("code", "X = 1", "assert X == 1") for _ in range(5)))
            assert all(r.reward == 1.0 and r.failure is None for r in results)
            assert sum(r.cached for r in results) == 4
            assert svc.metrics()["code_passed"] == 1

    run(main())


def test_cache_is_bounded_and_can_be_disabled() -> None:
    async def main() -> None:
        async with RewardService(num_workers=1, timeout_s=10, cache_size=2, preload=()) as svc:
            for i in range(4):
                await svc.score("arithmetic", f"#{i}", str(i))
            assert svc.metrics()["cache_size"] == 2
            assert (await svc.score("arithmetic", "#3", "3")).cached
            assert not (await svc.score("arithmetic", "#0", "0")).cached
        async with RewardService(num_workers=1, timeout_s=10, cache_size=0, preload=()) as svc:
            await svc.score("arithmetic", "#1", "1")
            assert not (await svc.score("arithmetic", "#1", "1")).cached

    run(main())


def test_arithmetic_and_custom_verifiers(custom_module: str) -> None:
    async def main() -> None:
        async with RewardService(num_workers=2, timeout_s=10, preload=()) as svc:
            assert (await svc.score("arithmetic", "3+4=7;#7", "7")).reward == 1.0
            assert (await svc.score("arithmetic", "3+4=7;#8", "7")).reward == 0.0
            assert (await svc.score(f"custom:{custom_module}:exact", " ok ", "ok")).reward == 1.0
            assert (await svc.score(f"custom:{custom_module}:exact", "no", "ok")).reward == 0.0
            r = await svc.score(f"custom:{custom_module}:uses_row", "c", "ref", prompt="abc", row={"bonus": 2})
            assert r.reward == 5.0
            # prompt and row are part of the cache key for custom verifiers
            r2 = await svc.score(f"custom:{custom_module}:uses_row", "c", "ref", prompt="abcd", row={"bonus": 2})
            assert r2.reward == 6.0 and not r2.cached
            assert (await svc.score(f"custom:{custom_module}:coro", "c", "r")).reward == 0.5

    run(main())


def test_verifier_errors_are_failures_not_zero_and_not_retried(custom_module: str) -> None:
    async def main() -> None:
        async with RewardService(num_workers=1, timeout_s=10, max_retries=2, preload=()) as svc:
            for fn, fragment in [
                ("boom", "RuntimeError: boom"),
                ("nan", "non-finite"),
                ("text", "expected a number"),
                ("missing_function", "AttributeError"),
            ]:
                r = await svc.score(f"custom:{custom_module}:{fn}", "c", "r")
                assert r.failure is not None and r.failure.startswith("error: ") and fragment in r.failure
            r = await svc.score("custom:no_such_module_anywhere:f", "c", "r")
            assert r.failure is not None and "ModuleNotFoundError" in r.failure
            m = svc.metrics()
            assert m["retries"] == 0 and m["errors"] == 5 and m["failures"] == 5 and m["cache_size"] == 0

    run(main())


def test_infrastructure_errors_are_retried(custom_module: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with RewardService(num_workers=1, timeout_s=10, max_retries=1, preload=()) as svc:
            row = {"marker": str(tmp_path / "seen")}
            r = await svc.score(f"custom:{custom_module}:flaky_infra", "c", "r", row=row)
            assert (r.reward, r.failure) == (1.0, None)
            assert svc.metrics()["retries"] == 1

    run(main())


def test_dead_worker_is_retried_then_reported(custom_module: str) -> None:
    async def main() -> None:
        async with RewardService(num_workers=2, timeout_s=10, max_retries=2, preload=()) as svc:
            r = await svc.score(f"custom:{custom_module}:die", "c", "r")
            assert r.failure == "worker_died" and r.reward == 0.0
            m = svc.metrics()
            assert m["worker_deaths"] == 3 and m["retries"] == 2
            assert (await svc.score(f"custom:{custom_module}:exact", "ok", "ok")).reward == 1.0

    run(main())


def test_hung_verifier_is_killed_and_replaced(custom_module: str) -> None:
    async def main() -> None:
        async with RewardService(num_workers=2, timeout_s=1.0, max_retries=2, preload=()) as svc:
            hung = await asyncio.wait_for(
                asyncio.gather(*(svc.score(f"custom:{custom_module}:hang", str(i), "r") for i in range(3))), HANG_S
            )  # a hang guard only
            assert all(r.failure == "timeout" for r in hung)
            # two workers: the third hang waited for a replacement worker, then timed out too
            m = svc.metrics()
            assert m["timeouts"] == 3 and m["workers_killed"] == 3 and m["retries"] == 0
            ok = await asyncio.gather(*(svc.score(f"custom:{custom_module}:exact", "ok", "ok") for _ in range(4)))
            assert all(r.reward == 1.0 for r in ok)
            assert svc.metrics()["workers_alive"] <= 2

    run(main())


def test_cancelled_request_frees_its_worker(custom_module: str) -> None:
    async def main() -> None:
        async with RewardService(num_workers=1, timeout_s=30, preload=()) as svc:
            task = asyncio.create_task(svc.score(f"custom:{custom_module}:hang", "c", "r"))
            await asyncio.sleep(1.0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            r = await asyncio.wait_for(svc.score(f"custom:{custom_module}:exact", "ok", "ok"), HANG_S)
            assert r.reward == 1.0

    run(main())


def test_code_timeouts_are_verdicts_not_failures() -> None:
    async def main() -> None:
        # 5 s: the two programs that end must end inside it, interpreter start included, on a loaded machine
        async with RewardService(num_workers=2, timeout_s=10, code_timeout_s=5.0, preload=()) as svc:
            ok, bad, slow = await asyncio.gather(
                svc.score("code", "def f():\n    return 1\n", "assert f() == 1"),
                svc.score("code", "def f():\n    return 2\n", "assert f() == 1"),
                svc.score("code", "while True:\n    pass\n", "assert f() == 1"),
            )
            assert (ok.reward, ok.failure) == (1.0, None)
            assert (bad.reward, bad.failure) == (0.0, None)
            assert (slow.reward, slow.failure) == (0.0, None)
            m = svc.metrics()
            assert m["code_passed"] == 1 and m["code_failed"] == 1 and m["code_timeout"] == 1
            assert m["failures"] == 0

    run(main())


def test_code_row_with_entry_point_builds_the_program() -> None:
    row = {"prompt": 'def add(a, b):\n    """Add."""\n', "entry_point": "add"}
    tests = "assert add(2, 3) == 5\n"

    async def main() -> None:
        async with RewardService(num_workers=1, timeout_s=10, preload=()) as svc:
            body = await svc.score("code", "    return a + b\n", tests, row=row)
            fenced = await svc.score("code", "Sure:\n```python\ndef add(a, b):\n    return a + b\n```", tests, row=row)
            wrong = await svc.score("code", "    return a - b\n", tests, row=row)
            assert (body.reward, fenced.reward, wrong.reward) == (1.0, 1.0, 0.0)

    run(main())


def workers(svc: RewardService) -> set[int]:
    return {w.proc.pid for w in svc._idle + list(svc._busy) if w.proc is not None}


def test_hostile_programs_through_the_pool() -> None:
    """Every hostile program is a failed verdict (ended by the sandbox's wall clock at the latest, well
    before the hang guard); the pool keeps serving and no process is left behind."""
    timeout = 2.0

    async def timed(svc: RewardService, name: str) -> tuple[str, RewardResult, float]:
        start = time.monotonic()
        program = HOSTILE[name].replace("{outside}", "/nonexistent/escaped").replace("{port}", "9")
        r = await svc.score("code", program, TESTS)
        return name, r, time.monotonic() - start

    async def main() -> None:
        async with RewardService(num_workers=2, timeout_s=10, code_timeout_s=timeout, preload=()) as svc:
            for name in HOSTILE:  # one at a time: each one's own wall time is measured
                name, r, elapsed = await timed(svc, name)
                assert (r.reward, r.failure) == (0.0, None), name
                assert elapsed < timeout + HANG_S, f"{name}: {elapsed:.2f}s"  # a hang guard
                assert sandbox_processes(callers=workers(svc)) == [], name
            m = svc.metrics()
            assert m["worker_deaths"] == 0 and m["failures"] == 0
            good = await svc.score("code", "def solution():\n    return 42\n", TESTS)
            assert good.reward == 1.0

    run(main())


def test_unknown_verifier_and_closed_service_raise() -> None:
    async def main() -> None:
        svc = RewardService(num_workers=1, preload=())
        with pytest.raises(ValueError):
            await svc.score("nope", "a", "b")
        await svc.close()
        await svc.close()
        with pytest.raises(RuntimeError):
            await svc.score("math", "a", "b")

    run(main())


def test_constructor_validates() -> None:
    with pytest.raises(ValueError):
        RewardService(num_workers=0)
    with pytest.raises(ValueError):
        RewardService(timeout_s=0)


def test_identical_failing_requests_share_one_attempt(custom_module: str) -> None:
    async def main() -> None:
        async with RewardService(num_workers=2, timeout_s=1.0, preload=()) as svc:
            spec = f"custom:{custom_module}:hang"
            results = await asyncio.gather(*(svc.score(spec, "same", "r") for _ in range(4)))
            assert [r.failure for r in results] == ["timeout"] * 4
            assert not any(r.cached for r in results)
            m = svc.metrics()  # one attempt timed out, not four in sequence (counted, not timed: load-proof)
            assert m["timeouts"] == 1 and m["failures"] == 4 and m["workers_killed"] == 1

    run(main())


def test_reward_services_satisfy_the_scorer_protocol() -> None:
    """The seam a workflow's ``score`` callable uses: the local service and the Ray pool, member by member."""
    assert protocol_problems(RewardService, RewardScorer) == []
    pytest.importorskip("ray")
    from asyncrl.launch.ray_clients import RayRewardPool

    assert protocol_problems(RayRewardPool, RewardScorer) == []
