"""``asyncrl train`` (``rollout.workflow=openai_agent``) end to end with an agent that streams and asks for tools:
each episode's first call streams with ``tools`` and ``tool_choice`` naming the calculator (the door writes the
call's opening; the tiny random-init policy writes the rest, a call or not), a call's result or a nudge follows,
and the final answer streams without ``tools``. Two steps on the real engine: the ledger passes, and every
trained sample is its session's ids, position by position the ids the engine was given and produced (0
mismatches), the loss on the engine's tokens only. Learning is not asked of it (a random-init policy);
``tests/rollout/test_openai_train.py`` makes the call a real one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncrl.config import load_config
from asyncrl.controller.ledger_checks import check_ledger
from asyncrl.launch.local import train
from asyncrl.models import load_policy
from asyncrl.rollout.openai_door import call_opening
from asyncrl.rollout.openai_workflow import OpenAIAgentWorkflow
from tests.invariants.test_token_exact import _Recording
from tests.rollout.scripted_engine import exactness

openai = pytest.importorskip("openai")

STEPS = 2
CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


def _stream(client: Any, messages: list, **kwargs: Any) -> dict[str, Any]:
    """A streamed reply joined by hand: the assistant message to send back."""
    content, calls = "", {}
    for chunk in client.chat.completions.create(model="policy", messages=messages, stream=True, **kwargs):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or ():
                calls[call.index] = {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [calls[k] for k in sorted(calls)]
    return message


def streaming_agent(base_url: str, api_key: str, task: dict[str, Any]) -> float:
    with openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        messages: list[Any] = [{"role": "user", "content": task["question"]}]
        named = {"type": "function", "function": {"name": "calculator"}}
        reply = _stream(client, messages, tools=[CALC], tool_choice=named, stream_options={"include_usage": True})
        messages.append(reply)
        for call in reply.get("tool_calls", []):
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "0"})
        if "tool_calls" not in reply:
            messages.append({"role": "user", "content": "The final answer?"})
        final = _stream(client, messages)
    return 1.0 if str(task["answer"]).strip() in (final["content"] or "") else 0.0


def test_a_streaming_tool_agent_trains_with_a_passing_ledger(
    tiny_policy_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trained_batches: list
) -> None:
    calls: list[Any] = []
    door = OpenAIAgentWorkflow._door

    def recorded(self: OpenAIAgentWorkflow, engine: Any) -> Any:  # every engine call of every group's door
        rec = _Recording(engine)
        rec.calls = calls
        return door(self, rec)

    monkeypatch.setattr(OpenAIAgentWorkflow, "_door", recorded)
    run_dir = tmp_path / "run"
    cfg = load_config(
        None,
        [
            f"model.path={tiny_policy_dir}",
            f"run.run_dir={run_dir}",
            "run.progress=false",
            "run.torch_threads=1",
            "rollout.workflow=openai_agent",
            "agent.entrypoint=tests.integration.test_openai_stream_run:streaming_agent",
            "agent.max_tokens=160",
            "agent.max_turn_tokens=24",
            "rollout.max_new_tokens=24",
            "eval.max_new_tokens=24",
            "task.eval_size=4",
            "rollout.group_size=2",
            "controller.batch_size=2",
            f"controller.total_steps={STEPS}",
            "controller.trainer_process=false",
            "algo.filter_equal_rewards=false",
        ],
    )
    _, summary = train(cfg)
    assert summary["steps"] == STEPS
    report = check_ledger(run_dir, ended=True, total_steps=STEPS)
    assert report.ok and report.trained == STEPS * 2 * 2

    totals = {"sessions": 0, "model_tokens": 0, "mismatches": 0, "mask_errors": 0, "logprob_errors": 0}
    _, tok = load_policy(tiny_policy_dir)
    versions: set[int] = set()
    lead = tuple(tok.encode(call_opening(cfg.agent.tool_format, "calculator"), add_special_tokens=False))
    for groups, samples in trained_batches:
        trajectories = [t for g in groups for t in g.trajectories]
        for traj, sample in zip(trajectories, samples, strict=True):
            assert (
                sample.token_ids == traj.token_ids and sample.loss_mask == (0,) * len(traj.prompt_ids) + traj.loss_mask
            )
            first = traj.model_segments[0].token_ids
            seed = next(
                c.sampling.seed
                for c in calls
                if c.input_ids == traj.prompt_ids and c.output.output_ids == first[: len(c.output.output_ids)]
            )
            mine = [c for c in calls if c.sampling.seed == seed and traj.token_ids[: len(c.input_ids)] == c.input_ids]
            found = exactness(traj, mine)
            assert found["engine_tokens"] == sum(traj.loss_mask)
            for key in ("mismatches", "mask_errors", "logprob_errors"):
                totals[key] += found[key]
            totals["sessions"] += 1
            totals["model_tokens"] += sum(traj.loss_mask)
            versions.update(v for v in traj.versions if v >= 0)
            assert len(traj.turns) == 2 and traj.prompt_ids[-len(lead) :] == lead  # the door's opening: no loss
    print(json.dumps(totals | {"versions": sorted(versions), "wall_s": summary["wall_s"]}))
    assert totals["sessions"] == STEPS * 2 * 2 and totals["mismatches"] == totals["mask_errors"] == 0
    assert totals["logprob_errors"] == 0
