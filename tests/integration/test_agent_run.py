"""``asyncrl train`` with ``rollout.workflow=agent task.name=calculator``: multi-turn tool episodes through
the ordinary loop. The tiny policy is first taught the calculator conversation for a few seconds (a
multi-turn warm start on ``chat.demonstration_ids``), so that its episodes call the tool and the ledger
holds environment tokens. The run finishes; every trained sample's ledger line holds its episode (turns,
tool calls, model and environment tokens); the trained sequence is the ids the engine produced with
environment tokens out of the loss; staleness stays within the bound; held-out accuracy is the
workflow's own (episodes played, the environment's reward)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from asyncrl.config import load_config
from asyncrl.controller.rundir import read_jsonl
from asyncrl.data.calculator import demonstration, make_calculator_splits
from asyncrl.launch.local import train
from asyncrl.launch.stages import build_workflow, engine_max_seq_len
from asyncrl.models import load_policy
from asyncrl.rollout.agent import AgentWorkflow
from asyncrl.rollout.chat import ChatRenderer, demonstration_ids
from asyncrl.rollout.envs.base import Message
from asyncrl.rollout.envs.calculator import CALCULATOR_SYSTEM, calculator_tool
from asyncrl.rollout.workflow import run_episode

STEPS = 3


def _teach_calculator(model_dir: Path, out: Path, steps: int = 100) -> Path:
    """A few seconds of supervised training on worked calculator conversations (``tag`` calls); one torch
    thread (several oversubscribe a loaded machine's cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _teach(model_dir, out, steps)
    finally:
        torch.set_num_threads(threads)


def _teach(model_dir: Path, out: Path, steps: int) -> Path:
    model, tokenizer = load_policy(model_dir, device="cpu", dtype="float32")
    renderer = ChatRenderer(tokenizer, (tokenizer.eos_token_id,))
    tools = (calculator_tool().schema(),)
    train_problems, _ = make_calculator_splits(7, 256, 1)
    examples = []
    for p in train_problems:
        messages = [Message("system", CALCULATOR_SYSTEM)] + [Message(m["role"], m["content"]) for m in demonstration(p)]
        examples.append(demonstration_ids(renderer, messages, tools))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(steps):
        batch = [examples[(step * 16 + i) % len(examples)] for i in range(16)]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([list(i) + [0] * (width - len(i)) for i, _ in batch])
        mask = torch.tensor([list(m) + [0] * (width - len(m)) for _, m in batch], dtype=torch.float32)
        logits = model(input_ids=ids).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        loss = (nll * mask[:, 1:]).sum() / mask[:, 1:].sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _cfg(model_dir: Path, run_dir: Path, extra: tuple[str, ...] = ()):
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            f"run.run_dir={run_dir}",
            "run.progress=false",
            "rollout.workflow=agent",
            "task.name=calculator",
            "agent.tool_format=tag",
            "agent.max_turns=3",
            "agent.max_tokens=96",
            "agent.max_turn_tokens=32",
            "rollout.max_new_tokens=32",
            "eval.max_new_tokens=32",
            "rollout.group_size=2",
            "rollout.max_slots=16",
            "controller.batch_size=2",
            "controller.max_staleness=1",
            "controller.max_concurrent=8",
            f"controller.total_steps={STEPS}",
            "controller.trainer_process=false",
            "task.eval_size=4",
            "task.train_size=64",
            "eval.greedy=true",
            "eval.report_greedy=false",
            "algo.filter_equal_rewards=false",
            *extra,
        ],
    )


def test_the_workflow_is_built_from_the_config(tiny_policy_dir) -> None:
    _, tokenizer = load_policy(tiny_policy_dir, device="cpu", dtype="float32")
    cfg = _cfg(tiny_policy_dir, Path("unused"))
    workflow = build_workflow(cfg, tokenizer, (tokenizer.eos_token_id,))
    assert isinstance(workflow, AgentWorkflow) and workflow.settings.tool_format == "tag"
    assert engine_max_seq_len(cfg) == cfg.rollout.max_prompt_len + 96  # agent.max_tokens > max_new_tokens
    python = build_workflow(_cfg(tiny_policy_dir, Path("unused"), ("agent.env=python",)), tokenizer, ())
    assert set(python.make_env().tools) == {"python"}  # type: ignore[attr-defined]
    single = load_config(None, [f"model.path={tiny_policy_dir}"])
    assert build_workflow(single, tokenizer, ()) is run_episode
    custom = load_config(None, ["rollout.workflow=asyncrl.rollout.workflow:run_episode"])
    assert build_workflow(custom, tokenizer, ()) is run_episode


def test_agent_calculator_run(tiny_policy_dir, tmp_path, trained_batches) -> None:
    model_dir = _teach_calculator(tiny_policy_dir, tmp_path / "calc-policy")
    run_dir = tmp_path / "run"
    batches = trained_batches
    _, summary = train(_cfg(model_dir, run_dir, ("eval.report_greedy=true",)))
    assert summary["steps"] == STEPS and summary["stop_reason"] is None and summary["ended_by"] == "total_steps"
    assert set(summary["code"]) == {"asyncrl", "git_commit", "git_dirty"}
    assert summary["accuracy_after"] is not None
    for held_out in (summary["eval_before"], summary["eval_after"]):  # the calculator's kinds, every problem once
        assert sum(k["prompts"] for k in held_out["by_kind"].values()) == 4
        assert held_out["greedy_by_kind"] == held_out["by_kind"]  # greedy both times: the same episodes
        assert held_out["greedy_episode_tool_call_frac"] == held_out["episode_tool_call_frac"]
    assert summary["max_staleness_seen"] <= 1

    trained = [r for r in read_jsonl(run_dir / "trajectories.jsonl") if r["status"] == "trained"]
    assert len(trained) == STEPS * 2 * 2  # steps x groups x episodes
    for r in trained:
        assert r["turns"], r
        assert r["model_tokens"] == sum(t["model_tokens"] for t in r["turns"])
        assert r["env_tokens"] == sum(t["env_tokens"] for t in r["turns"])
        assert r["response_len"] == r["model_tokens"] + r["env_tokens"]
        assert r["trained_step"] - r["min_version"] <= 1
    calls = sum(len(t["tool_calls"]) for r in trained for t in r["turns"])
    assert calls > 0 and sum(r["env_tokens"] for r in trained) > 0, json.dumps(trained[0])[:400]
    assert {r["episode_end"] for r in trained} <= {"answer", "env_done", "max_turns", "max_tokens", "length"}

    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert len(metrics) == STEPS and all("episode_turns_mean" in m for m in metrics)
    assert sum(m["episode_tool_calls_mean"] for m in metrics) > 0

    # the trained sequence is the episode's ids; the loss covers exactly its model tokens
    env_masked = 0
    for groups, samples in batches:
        trajectories = [t for g in groups for t in g.trajectories]
        assert len(trajectories) == len(samples)
        for traj, sample in zip(trajectories, samples, strict=True):
            assert sample.token_ids == traj.token_ids
            assert sample.loss_mask == (0,) * len(traj.prompt_ids) + traj.loss_mask
            assert all(a == 0.0 for a, m in zip(sample.advantages, sample.loss_mask, strict=True) if not m)
            env_masked += len(traj.loss_mask) - sum(traj.loss_mask)
    assert env_masked > 0


@pytest.mark.parametrize("bad", ["nope", "mod.only"])
def test_a_bad_workflow_names_the_key(bad: str) -> None:
    with pytest.raises(Exception, match="rollout.workflow"):
        load_config(None, [f"rollout.workflow={bad}"])
