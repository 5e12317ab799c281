"""``agent.episode_mode`` tree and individual (``rollout.openai_tree``): agents on the real ``openai`` client that
trim their history or make two concurrent sub-calls from one prefix, through the workflow's door on a
scripted engine. Every trained token is one the engine sampled, given exactly the ids before it (0
mismatches), the loss mask is on those tokens only, the behaviour log-probs and versions are the engine's;
a tree sample is a root-to-leaf chain, an individual one a completion; rewards are the completion's own
(``/reward``) or the episode's discounted per later call. Linear mode still refuses such a history (400).
Over HTTP: a streamed answer's id names its completion, ``/reward``'s refusals, the record, the budget; the
config's rule that only ``openai_agent`` takes ``agent.episode_mode``."""

from __future__ import annotations

import asyncio
import urllib.error
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from asyncrl.config import AlgoConfig
from asyncrl.controller.buffer import groups_to_samples
from asyncrl.rollout.openai_workflow import DoorSettings, OpenAIAgentWorkflow
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Group, ModelSegment, Prompt, Trajectory
from tests.rollout.chat_templates import qwen_tokenizer
from tests.rollout.scripted_engine import Call, ScriptedEngine, Turn

openai = pytest.importorskip("openai")
from tests.rollout.branching_agents import OWN_REWARD, branch, give_reward, trim  # noqa: E402  (needs openai)

PROMPT = Prompt("p1", (1, 2), "3", {"question": "1+2?"})
GAMMA = 0.5


@pytest.fixture(scope="module")
def tok():
    return qwen_tokenizer()


@dataclass
class _Overlapping(ScriptedEngine):
    """Counts, per episode (its seed), the most calls in the engine at once."""

    running: dict[int, int] = field(default_factory=dict)
    most: dict[int, int] = field(default_factory=dict)

    async def generate(self, input_ids: Any, sampling: SamplingParams, n: int = 1, on_sample_done: Any = None) -> Any:
        seed = int(sampling.seed or 0)
        self.running[seed] = self.running.get(seed, 0) + 1
        self.most[seed] = max(self.most.get(seed, 0), self.running[seed])
        try:
            return await super().generate(input_ids, sampling, n, on_sample_done)
        finally:
            self.running[seed] -= 1


def _run(tok: Any, agent: Any, mode: str, group: int = 2) -> tuple[Group, ScriptedEngine]:
    ids = lambda text: tuple(tok.encode(text, add_special_tokens=False)) + (tok.eos_token_id,)  # noqa: E731
    replies = ["#4", "#3 yes", "#5 maybe", "#3"]
    scripts = {100 + i: [Turn(ids(r + " " * i), version=k) for k, r in enumerate(replies)] for i in range(group)}
    engine = _Overlapping(scripts, delay_s=0.05)  # concurrent sub-calls overlap in the engine
    settings = DoorSettings(episode_mode=mode, reward_discount=GAMMA)  # type: ignore[arg-type]
    workflow = OpenAIAgentWorkflow(tok, agent, settings, end_of_turn_ids=(tok.eos_token_id,))

    async def score(prompt: Prompt, completion: Any) -> tuple[float, str | None]:
        raise AssertionError("the agent returns its reward")

    sampling = SamplingParams(max_new_tokens=16, seed=100)
    return asyncio.run(asyncio.wait_for(workflow(engine, PROMPT, sampling, group, score, 0), 60)), engine


def _exactness(traj: Trajectory, calls: Sequence[Call]) -> dict[str, int]:
    """Each model segment against the engine call given exactly the ids before it."""
    by_input = {c.input_ids: c.output for c in calls}
    seen = list(traj.prompt_ids)
    found = {"model_tokens": 0, "mismatches": 0, "unmatched_segments": 0}
    for seg in traj.segments:
        if isinstance(seg, ModelSegment):
            out = by_input.get(tuple(seen))
            found["model_tokens"] += len(seg.token_ids)
            if out is None:
                found["unmatched_segments"] += 1
            else:
                found["mismatches"] += sum(a != b for a, b in zip(seg.token_ids, out.output_ids, strict=True))
                found["mismatches"] += int(seg.behav_logprobs != out.behav_logprobs or seg.versions != out.versions)
        seen += seg.token_ids
    return found


def _check_exact(group: Group, engine: ScriptedEngine) -> None:
    samples = groups_to_samples([group], AlgoConfig())
    assert len(samples) == len(group.trajectories)
    for traj, sample, episode in zip(group.trajectories, samples, group.episodes, strict=True):
        report = _exactness(traj, [c for c in engine.calls if c.sampling.seed == 100 + episode])
        assert report["mismatches"] == 0 and report["unmatched_segments"] == 0, report
        n = len(traj.prompt_ids)
        assert sample.token_ids == traj.token_ids and sample.loss_mask == (0,) * n + traj.loss_mask
        model = [t for s in traj.model_segments for t in s.token_ids]
        assert sum(sample.loss_mask) == len(model) == report["model_tokens"]
        assert [t for t, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m] == model
        lps = [lp for s in traj.model_segments for lp in s.behav_logprobs]
        assert [lp for lp, m in zip(sample.behav_logprobs, sample.loss_mask, strict=True) if m] == lps
        versions = [v for s in traj.model_segments for v in s.versions]
        assert [v for v, m in zip(sample.versions, sample.loss_mask, strict=True) if m] == versions


def _episode_rewards(group: Group) -> dict[int, float]:
    return {e: r for e, r in zip(group.episodes, group.rewards, strict=True)}


def test_a_trimmed_history_trains_individually(tok) -> None:
    group, engine = _run(tok, trim, "individual")
    assert len(engine.calls) == 8 and group.episodes == (0, 0, 0, 0, 1, 1, 1, 1)
    _check_exact(group, engine)
    for e in (0, 1):
        trajs = [t for t, g in zip(group.trajectories, group.episodes, strict=True) if g == e]
        assert all(len(t.segments) == 1 for t in trajs)  # a completion: its prompt, its tokens
        assert trajs[1].prompt_ids[: len(trajs[0].token_ids)] == trajs[0].token_ids  # the second extends the first
        assert trajs[3].prompt_ids[: len(trajs[2].token_ids)] == trajs[2].token_ids
        assert trajs[2].prompt_ids[: len(trajs[0].prompt_ids)] != trajs[0].prompt_ids  # the summary: a new root
    # the episode's reward R: the 4th gets R, the 3rd R*γ, the 2nd its own, the 1st R*γ³ (three calls after it)
    rewards = group.rewards
    for e in (0, 1):
        r = rewards[4 * e : 4 * e + 4]
        big = r[3]
        assert big in (0.0, 1.0) and r[1] == OWN_REWARD
        assert r[2] == pytest.approx(big * GAMMA) and r[0] == pytest.approx(big * GAMMA**3)


def test_a_trimmed_history_trains_as_two_chains_in_tree_mode(tok) -> None:
    group, engine = _run(tok, trim, "tree")
    assert group.episodes == (0, 0, 1, 1)  # per episode: (1st, 2nd) joined, (3rd, 4th) joined
    _check_exact(group, engine)
    for traj in group.trajectories:
        assert len(traj.model_segments) == 2 and len(traj.turns) == 2 and traj.turns[0].env_tokens > 0
    for e in (0, 1):
        assert group.rewards[2 * e] == OWN_REWARD and group.rewards[2 * e + 1] in (0.0, 1.0)  # each leaf's reward


def test_concurrent_sub_calls_from_one_prefix_branch(tok) -> None:
    group, engine = _run(tok, branch, "tree")
    # per episode: first -> A -> last, and first -> B: two chains sharing the first completion
    assert group.episodes == (0, 0, 1, 1)
    _check_exact(group, engine)
    for e in (0, 1):
        b_chain, a_chain = [t for t, g in zip(group.trajectories, group.episodes, strict=True) if g == e]
        assert len(a_chain.model_segments) == 3 and len(b_chain.model_segments) == 2
        shared = len(b_chain.prompt_ids) + len(b_chain.segments[0].token_ids)
        assert a_chain.token_ids[:shared] == b_chain.token_ids[:shared]  # the shared prefix, in both
        assert a_chain.segments[1] != b_chain.segments[1]  # the sub-calls' own messages
        assert group.rewards[2 * e] == OWN_REWARD and group.rewards[2 * e + 1] in (0.0, 1.0)
    assert isinstance(engine, _Overlapping) and engine.most == {100: 2, 101: 2}  # the sub-calls ran at once


def test_concurrent_sub_calls_individually_and_their_discounts(tok) -> None:
    group, engine = _run(tok, branch, "individual")
    assert group.episodes == (0,) * 4 + (1,) * 4
    _check_exact(group, engine)
    for e in (0, 1):
        r = group.rewards[4 * e : 4 * e + 4]  # recording order: first, then A and B (either order), last
        big = r[3]
        assert r[0] == pytest.approx(big * GAMMA**2)  # two sequential calls after it (a sub-call, the last)
        own, other = (r[1], r[2]) if r[1] == OWN_REWARD else (r[2], r[1])  # B's own; A: one call after it
        assert own == OWN_REWARD and other == pytest.approx(big * GAMMA)


def test_linear_mode_still_refuses_an_edited_history_and_rewards_per_completion(tok) -> None:
    refused: list[str] = []

    def probe(base_url: str, api_key: str, task: dict[str, Any]) -> float:
        with openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
            messages: list[Any] = [{"role": "user", "content": task["question"]}]
            first = client.chat.completions.create(model="m", messages=messages)
            try:
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": "summary"}])
            except openai.BadRequestError as e:
                refused.append(str(e))
            try:
                give_reward(base_url, api_key, first.id, 1.0)
            except urllib.error.HTTPError as e:
                refused.append(f"{e.code} {e.read().decode()}")
        return 1.0

    group, engine = _run(tok, probe, "linear", group=1)
    assert len(engine.calls) == 1 and group.rewards == (1.0,) and group.episodes == ()
    assert len(refused) == 2 and "differs from the recorded conversation" in refused[0], refused
    assert refused[1].startswith("400") and "agent.episode_mode=tree or individual" in refused[1]


def test_the_door_of_a_branching_session(tok) -> None:
    """Over HTTP: a streamed answer's id names its completion too; ``/reward``'s 400s and 404; the record lists
    each completion with its parent; a branching session's token budget counts every completion's tokens."""
    from asyncrl.rollout.openai_door import ChatDoor, DoorServer

    ids = lambda text: tuple(tok.encode(text, add_special_tokens=False)) + (tok.eos_token_id,)  # noqa: E731
    engine = ScriptedEngine({7: [Turn(ids("#4 is it")), Turn(ids("#3 " + "and so on " * 20))]})
    door = ChatDoor(
        engine, tok, end_of_turn_ids=(tok.eos_token_id,), open_sessions_on_call=False, serves_any_model=True
    )
    server = DoorServer(door, "k")
    found: dict[str, Any] = {}

    def agent(base_url: str) -> None:
        with openai.OpenAI(base_url=base_url, api_key="k", max_retries=0) as client:
            q = [{"role": "user", "content": "1+2?"}]
            chunks = list(client.chat.completions.create(model="m", messages=q, stream=True))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            found["streamed"] = {c.id for c in chunks}
            child = client.chat.completions.create(
                model="m", messages=[*q, {"role": "assistant", "content": text}, {"role": "user", "content": "?"}]
            )
            found["child"] = child.id
            found["reward"] = give_reward(base_url, "k", child.id, -1.5)
            for body in ({"reward": "x"}, {}, {"reward": 1, "other": 2}):
                try:
                    give_reward(base_url, "k", child.id, body)  # type: ignore[arg-type]
                except urllib.error.HTTPError as e:
                    found.setdefault("bad", []).append(e.code)
            try:
                give_reward(base_url, "k", "chatcmpl-nosuch", 1.0)
            except urllib.error.HTTPError as e:
                found["unknown"] = e.code
            try:  # 30 tokens after the roots' openings, the child cut to fill them: the third call has none left
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": "trimmed"}])
            except openai.BadRequestError as e:
                found["spent"] = str(e)

    async def main() -> None:
        await server.start()
        door.open_session("b", SamplingParams(max_new_tokens=16, seed=7), max_tokens=30, branching=True)
        try:
            await asyncio.to_thread(agent, server.base_url("b"))
        finally:
            await server.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
    record = door.store.get("b").summary()  # type: ignore[union-attr]
    first, child = record["completions"]
    assert found["streamed"] == {first["id"]} and found["child"] == child["id"]
    assert (first["parent"], child["parent"], child["reward"], first["reward"]) == (None, 0, -1.5, None)
    assert found["reward"] == {"session_id": "b", "completion_id": child["id"], "reward": -1.5}
    assert found["bad"] == [400, 400, 400] and found["unknown"] == 404
    assert "token budget of 30 is spent" in found["spent"] and len(engine.calls) == 2
    assert child["finish_reason"] == "length" and door.store.get("b").used == 30  # type: ignore[union-attr]
    assert child["prompt_ids"][: len(first["prompt_ids"]) + len(first["output_ids"])] == (
        first["prompt_ids"] + first["output_ids"]
    )


def test_episode_mode_needs_the_openai_agent_workflow() -> None:
    from asyncrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="agent.episode_mode=tree needs rollout.workflow=openai_agent"):
        load_config(None, ["agent.episode_mode=tree"])
    with pytest.raises(ConfigError, match="agent.reward_discount"):
        load_config(None, ["rollout.workflow=openai_agent", "agent.entrypoint=a.b:c", "agent.reward_discount=1.5"])
