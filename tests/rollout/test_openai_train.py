"""An agent written on the real ``openai`` client, streaming (``stream=True``, ``include_usage``, log-probs) and
calling a tool, trains through the door (``rollout.workflow=openai_agent``'s ``OpenAIAgentWorkflow``) on the real
``LocalEngine``, with 0 token mismatches.

The tiny policy is first taught one thing (120 Adam steps on one sequence, a few seconds): after the door's forced
opening ``<tool_call>{"name": "calculator", "arguments": `` it writes ``{"expression": "6*7"}}</tool_call>``, so its
first turn is a real tool call, parsed from what the engine sampled. Per session the agent asks with
``tool_choice`` naming the calculator, joins the streamed chunks with the client's own accumulator
(``ChatCompletionStreamState``), runs the call, sends the result, and streams the final answer without ``tools``.
Three sessions; a weight update republishes the same weights mid-group (so tokens carry versions 0 and 1 and the
log-probs stay those of one policy). Then: every session's trained ids are the engine's inputs and outputs,
position by position (0 mismatches, loss mask exactly on the engine's tokens, log-probs and versions equal), the
door's opening and the tool result are environment tokens, the trainer's recomputed log-probs of the model tokens
equal the engine's (1e-4), and one training step on the group's samples updates the policy."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import torch

from asyncrl.config import AlgoConfig, TrainerConfig
from asyncrl.controller.buffer import groups_to_samples
from asyncrl.models import build_tiny_policy, load_policy
from asyncrl.rollout.chat import ChatRenderer
from asyncrl.rollout.envs.base import Message
from asyncrl.rollout.openai_workflow import DoorSettings, OpenAIAgentWorkflow
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import EnvSegment, Prompt, TrainBatch, WeightUpdate
from tests.invariants.test_token_exact import TOL, _as_engine, _assert_exact, _Recording
from tests.rollout.scripted_engine import exactness

openai = pytest.importorskip("openai")
from openai.lib.streaming.chat import ChatCompletionStreamState  # noqa: E402

CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Exact integer arithmetic.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
QUESTION = "What is 6*7?"
LEAD = '<tool_call>{"name": "calculator", "arguments": '
REST = '{"expression": "6*7"}}</tool_call>'
TEMPERATURE = 0.5
SEEN: list[dict[str, Any]] = []


def _streamed(client: Any, **kwargs: Any) -> Any:
    """A streamed completion as the client's own accumulator joins it (which raises on ``finish_reason``
    ``length``), and its usage chunk."""
    state, usage = ChatCompletionStreamState(), None
    for chunk in client.chat.completions.create(
        model="gpt-4o", stream=True, logprobs=True, stream_options={"include_usage": True}, **kwargs
    ):
        state.handle_chunk(chunk)
        usage = chunk.usage or usage
    return state.get_final_completion(), usage


def streaming_tool_agent(base_url: str, api_key: str, task: dict[str, Any]) -> float:
    """A tool call forced by name, its result, then a final answer without tools; both calls streamed."""
    with openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        messages: list[Any] = [{"role": "user", "content": task["question"]}]
        named = {"type": "function", "function": {"name": "calculator"}}
        first, usage = _streamed(client, messages=messages, tools=[CALC], tool_choice=named)
        choice = first.choices[0]
        SEEN.append(
            {
                "finish": choice.finish_reason,
                "calls": choice.message.tool_calls,
                "usage": usage,
                "logprobs": len(choice.logprobs.content or ()),
            }
        )
        messages.append(choice.message.model_dump(exclude_none=True, exclude={"parsed"}))
        for call in choice.message.tool_calls or ():
            expression = json.loads(call.function.arguments)["expression"]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(eval(expression, {}))})  # noqa: S307
        if not choice.message.tool_calls:
            messages.append({"role": "user", "content": "Use the calculator."})
        final = client.chat.completions.create(model="gpt-4o", messages=messages, max_tokens=24, stream=True)
        answer = "".join(c.choices[0].delta.content or "" for c in final if c.choices)  # joined by hand
    return len(answer) / 24  # a reward that differs between sessions


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model is faster on one thread than on two busy ones
    yield
    torch.set_num_threads(before)


def _teach_the_call(model: Any, tok: Any) -> None:
    """120 Adam steps on the call's continuation after the door's opening."""
    renderer = ChatRenderer(tok, (tok.eos_token_id,))
    opening = renderer.opening_ids([Message("user", QUESTION)], [CALC]) + renderer.encode(LEAD)
    ids = torch.tensor([opening + renderer.encode(REST) + (tok.eos_token_id,)])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(120):
        logits = model(ids).logits[0, len(opening) - 1 : -1]
        torch.nn.functional.cross_entropy(logits, ids[0, len(opening) :]).backward()
        optimizer.step()
        optimizer.zero_grad()


def test_a_streaming_tool_calling_agent_trains_through_the_door(tmp_path: Any, one_thread: None) -> None:
    from asyncrl.rollout.engine import LocalEngine
    from asyncrl.trainer.trainer import Trainer

    tiny = build_tiny_policy(tmp_path / "tiny")
    model, tok = load_policy(tiny)
    _teach_the_call(model, tok)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ref, _ = load_policy(tiny)
    ref.load_state_dict(state)
    engine = LocalEngine(model, tok, max_slots=8, max_seq_len=512)
    rec = _Recording(engine)
    workflow = OpenAIAgentWorkflow(
        tok, streaming_tool_agent, DoorSettings(max_tokens=256, max_turn_tokens=48), end_of_turn_ids=(tok.eos_token_id,)
    )
    prompt = Prompt("calc-0", (), answer="42", meta={"question": QUESTION})
    sampling = SamplingParams(max_new_tokens=48, temperature=TEMPERATURE, seed=11)
    SEEN.clear()

    async def score(p: Prompt, c: Any) -> tuple[float, str | None]:
        raise AssertionError("the agent returns its reward")

    async def go() -> Any:
        task = asyncio.create_task(workflow(rec, prompt, sampling, 3, score, start_version=0))
        while engine.stats()["decode_steps"] < 20 and not task.done():
            await asyncio.sleep(0.001)
        await engine.update_weights(WeightUpdate(version=1, tensors={k: v.clone() for k, v in state.items()}))
        return await task

    try:
        group = asyncio.run(asyncio.wait_for(go(), 300))
    finally:
        engine.close()

    assert len(SEEN) == 3 and all(s["finish"] == "tool_calls" and len(s["calls"]) == 1 for s in SEEN), SEEN
    assert all(s["usage"].completion_tokens == len(tok.encode(REST)) + 1 for s in SEEN)  # the turn and its end
    assert all(s["logprobs"] == len(tok.encode(REST)) for s in SEEN)  # model tokens only: not the door's opening
    lead_ids = ChatRenderer(tok, (tok.eos_token_id,)).encode(LEAD)
    mismatches = 0
    for i, traj in enumerate(group.trajectories):
        calls = [c for c in rec.calls if c.sampling.seed == 11 + i]
        mismatches += exactness(traj, calls)["mismatches"]
        _assert_exact(traj, _as_engine(calls))
        assert traj.prompt_ids[-len(lead_ids) :] == lead_ids  # the door's opening: environment, no loss
        assert traj.turns[0].tool_calls == ("calculator",) and len(traj.turns) == 2
        (glue,) = [s for s in traj.segments if isinstance(s, EnvSegment)]
        assert "42" in tok.decode(list(glue.token_ids))  # the tool's result, as the agent computed it
    versions = {v for t in group.trajectories for v in t.versions if v >= 0}
    assert versions == {0, 1}  # the update landed mid-group

    samples = groups_to_samples([group], AlgoConfig())
    for traj, sample in zip(group.trajectories, samples, strict=True):
        assert sample.token_ids == traj.token_ids and sample.loss_mask == (0,) * len(traj.prompt_ids) + traj.loss_mask
    trainer = Trainer(ref, TrainerConfig(max_tokens_per_micro_batch=512), AlgoConfig(), temperature=TEMPERATURE)
    worst = 0.0
    for s, logp in zip(samples, trainer.compute_logprobs(samples), strict=True):
        mask = torch.tensor(s.loss_mask, dtype=torch.bool)
        worst = max(worst, (logp.float().cpu()[mask] - torch.tensor(s.behav_logprobs)[mask]).abs().max().item())
    assert worst <= TOL, f"trainer vs engine log-prob max abs diff {worst:.2e} over streamed tool sessions"
    before = {k: v.clone() for k, v in ref.state_dict().items()}
    result = trainer.train_step(TrainBatch(tuple(samples), version=0))
    model_tokens = sum(sum(t.loss_mask) for t in group.trajectories)
    print(
        json.dumps(
            {
                "sessions": len(samples),
                "model_tokens": model_tokens,
                "mismatches": mismatches,
                "trainer_vs_engine_max_abs": worst,
                "rewards": group.rewards,
                "loss": result.metrics.get("loss"),
            }
        )
    )
    assert result.applied and result.version == 1
    assert any(not torch.equal(before[k], v) for k, v in ref.state_dict().items())
