"""The LLM-as-judge verifier (``task.verifier=judge:<url>[#model]``, ``reward.judge``) in the reward service: verdicts
from an OpenAI-compatible endpoint, many judgements in flight at once, and the service's failure handling (a
judge that does not answer in time is a ``timeout``, a 5xx is retried, a reply without a verdict or a refusal is
an error; none of them a 0). The endpoint is a small aiohttp app speaking chat completions, standing in for a
judge model, and ``asyncrl serve engine`` on the tiny policy (the project's own engine as the judge)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from aiohttp import web

from asyncrl.models import build_tiny_policy, load_policy
from asyncrl.reward.judge import TEMPLATE, JudgeTarget, parse_verdict
from asyncrl.reward.service import RewardService
from asyncrl.reward.verifiers import resolve_verifier
from asyncrl.rollout.engine import LocalEngine
from asyncrl.rollout.server import ServerThread


class Judge:
    """A chat-completions endpoint that judges by whether the answer's last number is the reference's."""

    def __init__(self) -> None:
        self.calls = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.fail_first = 0
        """Answer 503 to this many calls first."""
        self.mode = "judge"
        self.bodies: list[dict] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        self.calls += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.05)  # long enough for concurrent requests to overlap
            if self.fail_first > 0:
                self.fail_first -= 1
                return web.json_response({"error": {"message": "overloaded"}}, status=503)
            if self.mode == "slow":
                await asyncio.sleep(5)
            if self.mode == "refuse":
                return web.json_response({"error": {"message": "bad model"}}, status=400)
            text = body["messages"][0]["content"]
            reference = text.split("Reference answer:\n", 1)[1].split("\n", 1)[0]
            answer = text.split("Answer to grade:\n", 1)[1].split("\n\n", 1)[0]
            numbers = re.findall(r"-?\d+", answer)
            verdict = "CORRECT" if numbers and numbers[-1] == reference else "INCORRECT"
            content = "I cannot tell." if self.mode == "mute" else f"The answer says {answer!r}.\nVERDICT: {verdict}"
            return web.json_response({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})
        finally:
            self.in_flight -= 1


async def _serve(judge: Judge) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", judge.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/v1"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_names_and_verdicts() -> None:
    assert resolve_verifier("judge:http://127.0.0.1:8000/v1#qwen") == JudgeTarget("http://127.0.0.1:8000/v1", "qwen")
    assert resolve_verifier("judge:https://api.example.com/v1") == JudgeTarget("https://api.example.com/v1", "default")
    with pytest.raises(ValueError, match="judge:http://host:port/v1"):
        resolve_verifier("judge:localhost:8000")
    assert parse_verdict("thinking... VERDICT: incorrect\nno wait, VERDICT: CORRECT") == 1.0
    assert parse_verdict("VERDICT:INCORRECT") == 0.0
    with pytest.raises(ValueError, match="no verdict"):
        parse_verdict("yes")


def test_a_batch_of_verdicts_in_flight_together_and_cached() -> None:
    judge = Judge()

    async def main():
        runner, url = await _serve(judge)
        try:
            async with RewardService(num_workers=1, remote_timeout_s=5.0) as svc:
                verifier = f"judge:{url}#grader"
                answers = [f"so it is {n}" for n in range(12, 20)]
                results = await asyncio.gather(*(svc.score(verifier, a, "15", prompt="7+8?") for a in answers))
                again = await svc.score(verifier, answers[3], "15", prompt="7+8?")
                return results, again, svc.metrics()
        finally:
            await runner.cleanup()

    results, again, metrics = run(main())
    assert [r.reward for r in results] == [float(n == 15) for n in range(12, 20)]
    assert all(r.failure is None for r in results) and again.cached and again.reward == 1.0
    assert judge.calls == 8 and judge.max_in_flight > 1  # judged together, not one after another
    body = judge.bodies[0]
    assert body["model"] == "grader" and body["temperature"] == 0.0
    assert body["messages"][0]["content"] == TEMPLATE.format(question="7+8?", reference="15", response="so it is 12")
    assert metrics["verdicts"] == 9 and metrics["failures"] == 0


@pytest.mark.parametrize(
    ("mode", "fail_first", "failure", "calls"),
    [
        ("slow", 0, "timeout", 1),
        ("judge", 2, None, 3),  # two 503s retried, then a verdict
        ("judge", 5, "error: judge at", 3),  # 503 past max_retries=2: marked, not 0
        ("mute", 0, "error: judge: ValueError: the judge's reply has no verdict", 1),
        ("refuse", 0, "error: judge: ValueError: judge at", 1),
    ],
)
def test_failures_are_marked_never_zero(mode: str, fail_first: int, failure: str | None, calls: int) -> None:
    judge = Judge()
    judge.mode, judge.fail_first = mode, fail_first

    async def main():
        runner, url = await _serve(judge)
        try:
            async with RewardService(num_workers=1, max_retries=2, remote_timeout_s=1.0) as svc:
                return await svc.score(f"judge:{url}", "it is 15", "15", prompt="7+8?"), svc.metrics()
        finally:
            await runner.cleanup()

    result, metrics = run(main())
    if failure is None:
        assert result.failure is None and result.reward == 1.0 and metrics["retries"] == 2
    else:
        assert result.failure is not None and result.failure.startswith(failure) and result.reward == 0.0
        assert metrics["failures"] == 1
    assert judge.calls == calls


def test_an_unreachable_judge_is_retried_then_marked() -> None:
    async def main():
        async with RewardService(num_workers=1, max_retries=1, remote_timeout_s=2.0) as svc:
            return await svc.score("judge:http://127.0.0.1:9/v1", "15", "15"), svc.metrics()

    result, metrics = run(main())
    assert result.failure is not None and "unreachable" in result.failure and metrics["retries"] == 1


def test_the_projects_engine_as_the_judge(tmp_path: Path) -> None:
    """``asyncrl serve engine`` (the tiny policy behind the OpenAI-compatible door) answers the judge's requests;
    an untrained policy writes no verdict, which marks the sample instead of scoring it."""
    model, tok = load_policy(build_tiny_policy(tmp_path / "tiny"))
    engine = LocalEngine(model, tok, max_slots=8, max_seq_len=512)
    with ServerThread(engine, eos_ids=(tok.eos_token_id,), model_path="tiny") as srv:

        async def main():
            async with RewardService(num_workers=1, max_retries=0, remote_timeout_s=30.0) as svc:
                return await asyncio.gather(*(svc.score(f"judge:{srv.url}/v1#tiny", f"{n}", "3") for n in range(3)))

        results = run(main())
    for r in results:
        assert r.reward == 0.0 and r.failure is not None
        assert r.failure.startswith("error: judge: ValueError: the judge's reply has no verdict"), r.failure
    assert json.dumps([r.failure for r in results])  # one line each
