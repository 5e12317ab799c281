"""DESIGN §4.8 through the OpenAI door: an ``openai``-client agent's sessions on the real ``LocalEngine``
(the tiny model, three 3-call sessions, a weight update republishing the same weights mid-episode, so
η = 0) are token-exact (trained ids = the engine's inputs and outputs, log-probs and versions equal,
loss mask on exactly the engine's tokens), and the trainer's recomputed log-probs of every model token
equal the engine's behaviour log-probs to 1e-4, across turns; the same for sessions that branch
(``agent.episode_mode`` tree and individual, concurrent sub-calls from one prefix)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from asyncrl.config import AlgoConfig, TrainerConfig
from asyncrl.controller.buffer import groups_to_samples
from asyncrl.models import build_tiny_policy, load_policy
from asyncrl.rollout.openai_workflow import OpenAIAgentWorkflow
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import EnvSegment, Prompt, WeightUpdate
from tests.invariants.test_token_exact import TOL, _as_engine, _assert_exact, _Recording

openai = pytest.importorskip("openai")


def _three_calls(base_url: str, api_key: str, task: dict) -> float:
    with openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        messages: list[Any] = [{"role": "user", "content": task["question"]}]
        for turn in range(3):
            reply = client.chat.completions.create(model="m", messages=messages, max_tokens=40)
            messages += [reply.choices[0].message, {"role": "user", "content": f"and {turn * 7}?"}]
    return 0.5


def test_door_sessions_are_exact_and_match_the_trainer(tmp_path: Any) -> None:
    from asyncrl.rollout.engine import LocalEngine
    from asyncrl.trainer.trainer import Trainer

    tiny = build_tiny_policy(tmp_path / "tiny")
    model, tok = load_policy(tiny)
    ref, _ = load_policy(tiny)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    engine = LocalEngine(model, tok, max_slots=8, max_seq_len=512)
    rec = _Recording(engine)
    stops = (tok.eos_token_id, *tok.convert_tokens_to_ids(list("aeiou")))  # short turns from a random model
    workflow = OpenAIAgentWorkflow(tok, _three_calls, end_of_turn_ids=stops)
    prompt = Prompt("d0", (), answer="", meta={"question": "12+34"})
    sampling = SamplingParams(max_new_tokens=40, temperature=1.0, seed=3, stop_token_ids=stops)

    async def score(p: Prompt, c: Any) -> tuple[float, str | None]:
        raise AssertionError("the agent returns its reward")

    async def go() -> Any:
        task = asyncio.create_task(workflow(rec, prompt, sampling, 3, score, start_version=0))
        while engine.stats()["decode_steps"] < 12 and not task.done():
            await asyncio.sleep(0.001)
        await engine.update_weights(WeightUpdate(version=1, tensors={k: v.clone() for k, v in state.items()}))
        return await task

    try:
        group = asyncio.run(asyncio.wait_for(go(), 180))
    finally:
        engine.close()
    for i, traj in enumerate(group.trajectories):
        _assert_exact(traj, _as_engine([c for c in rec.calls if c.sampling.seed == 3 + i]))
        assert len(traj.turns) == 3 and sum(isinstance(s, EnvSegment) for s in traj.segments) == 2
    assert group.rewards == (0.5, 0.5, 0.5)
    versions = {v for t in group.trajectories for v in t.versions if v >= 0}
    assert versions == {0, 1}  # the update landed mid-episode: tokens of both versions, no other
    samples = groups_to_samples([group], AlgoConfig())
    trainer = Trainer(ref, TrainerConfig(max_tokens_per_micro_batch=256), AlgoConfig(), temperature=1.0)
    worst = 0.0
    for s, logp in zip(samples, trainer.compute_logprobs(samples), strict=True):
        mask = torch.tensor(s.loss_mask, dtype=torch.bool)
        worst = max(worst, (logp.float().cpu()[mask] - torch.tensor(s.behav_logprobs)[mask]).abs().max().item())
    assert worst <= TOL, f"trainer vs engine log-prob max abs diff {worst:.2e} over door sessions"


@pytest.mark.parametrize("mode", ["tree", "individual"])
def test_branching_sessions_are_exact_and_match_the_trainer(tmp_path: Any, mode: str) -> None:
    """``agent.episode_mode`` tree and individual on the real engine: an agent with two concurrent sub-calls
    from one prefix (``tests/rollout/branching_agents.py:branch``); every sample's model tokens are an engine
    call's output given exactly the ids before them, and the trainer's log-probs equal the engine's."""
    from asyncrl.rollout.engine import LocalEngine
    from asyncrl.rollout.openai_workflow import DoorSettings
    from asyncrl.trainer.trainer import Trainer
    from tests.rollout.branching_agents import branch

    tiny = build_tiny_policy(tmp_path / "tiny")
    model, tok = load_policy(tiny)
    ref, _ = load_policy(tiny)
    engine = LocalEngine(model, tok, max_slots=8, max_seq_len=512)
    rec = _Recording(engine)
    stops = (tok.eos_token_id, *tok.convert_tokens_to_ids(list("aeiou")))
    settings = DoorSettings(episode_mode=mode, reward_discount=0.5)  # type: ignore[arg-type]
    workflow = OpenAIAgentWorkflow(tok, branch, settings, end_of_turn_ids=stops)
    sampling = SamplingParams(max_new_tokens=24, temperature=1.0, seed=5, stop_token_ids=stops)

    async def score(p: Prompt, c: Any) -> tuple[float, str | None]:
        raise AssertionError("the agent returns its reward")

    try:
        group = asyncio.run(
            asyncio.wait_for(
                workflow(rec, Prompt("b0", (), "", {"question": "7*6"}), sampling, 2, score, start_version=0), 180
            )
        )
    finally:
        engine.close()
    per_episode = 2 if mode == "tree" else 4
    assert group.episodes == (0,) * per_episode + (1,) * per_episode
    by_input = {(c.sampling.seed, tuple(c.input_ids)): c.output for c in rec.calls}
    for traj, episode in zip(group.trajectories, group.episodes, strict=True):
        seen = list(traj.prompt_ids)
        for seg in traj.segments:
            if not isinstance(seg, EnvSegment):
                call = by_input[(5 + episode, tuple(seen))]  # an engine call of the episode given exactly these ids
                assert seg.token_ids == tuple(call.output_ids) and seg.behav_logprobs == tuple(call.behav_logprobs)
                assert seg.versions == tuple(call.versions)
            seen += seg.token_ids
    samples = groups_to_samples([group], AlgoConfig())
    trainer = Trainer(ref, TrainerConfig(max_tokens_per_micro_batch=256), AlgoConfig(), temperature=1.0)
    worst = 0.0
    for s, logp in zip(samples, trainer.compute_logprobs(samples), strict=True):
        mask = torch.tensor(s.loss_mask, dtype=torch.bool)
        worst = max(worst, (logp.float().cpu()[mask] - torch.tensor(s.behav_logprobs)[mask]).abs().max().item())
    tokens = sum(sum(s.loss_mask) for s in samples)
    print(f"{mode}: {len(samples)} samples, {len(rec.calls)} engine calls, {tokens} trained tokens, |diff| {worst:.1e}")
    assert worst <= TOL, f"trainer vs engine log-prob max abs diff {worst:.2e} over branching sessions"
