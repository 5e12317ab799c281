"""Tool-use rates of multi-turn episodes (``controller.metrics.tool_use_rates``): per attempted call,
correct (parsed, known tool, ran), malformed, and hits (the result the task needed); absent when
nothing was attempted; per episode, the share that calls at all; the held-out evaluation reports them
too, and kind by kind for prompts with kinds."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.controller.evaluate import evaluate
from asyncrl.controller.metrics import episode_metrics, tool_use_rates
from asyncrl.types import KIND_KEY, EnvSegment, Group, ModelSegment, Prompt, Trajectory, TurnRecord


def _turn(calls: int = 0, errors: int = 0, malformed: int = 0, hits: int | None = None) -> TurnRecord:
    return TurnRecord(
        1, 1, 0, 0, "stop", tool_calls=("calculator",) * calls, tool_errors=errors, malformed=malformed, tool_hits=hits
    )


def _episode(*turns: TurnRecord) -> Trajectory:
    segments = (ModelSegment((5,), (-0.1,), (0,), "stop"), EnvSegment((6,), "tool"))
    return Trajectory(prompt_ids=(1, 2), segments=segments, turns=turns, end="answer", env_reward=0.0)


def test_rates_count_attempted_calls() -> None:
    episodes = [
        _episode(_turn(calls=1, hits=1), _turn(hits=0)),  # a call whose result was the answer, then the answer
        _episode(_turn(calls=2, errors=1, hits=0), _turn(malformed=1, hits=0)),  # one failed, one malformed
        _episode(_turn(calls=1, hits=0)),  # ran, but computed the wrong thing
    ]
    rates = tool_use_rates(episodes)
    assert rates["tool_call_correct_rate"] == pytest.approx(3 / 5)  # 4 well-formed, 1 failed, of 5 attempts
    assert rates["tool_call_malformed_rate"] == pytest.approx(1 / 5)
    assert rates["tool_call_hit_rate"] == pytest.approx(1 / 5)
    assert rates["episode_tool_hit_frac"] == pytest.approx(1 / 3)
    assert rates["episode_tool_call_frac"] == 1.0  # every episode attempted a call


def test_the_share_of_episodes_that_call_counts_episodes_not_calls() -> None:
    """A policy that stops calling keeps its per-call rates; the share of calling episodes shows it."""
    calling = [_episode(_turn(calls=1, hits=1), _turn(hits=0)), _episode(_turn(malformed=2, hits=0), _turn(hits=0))]
    direct = [_episode(_turn(hits=0)) for _ in range(6)]  # answered at once, no call
    rates = tool_use_rates([*calling, *direct])
    assert rates["episode_tool_call_frac"] == pytest.approx(2 / 8)  # a malformed attempt counts as calling
    assert rates["tool_call_hit_rate"] == pytest.approx(1 / 3)  # per attempted call: 1 hit of 3 attempts
    assert tool_use_rates(calling)["tool_call_hit_rate"] == rates["tool_call_hit_rate"]  # blind to the 6
    assert rates["episode_tool_hit_frac"] == pytest.approx(1 / 8)
    assert tool_use_rates([]) == {}  # no episodes: no share


def test_no_attempt_and_no_check_leave_the_rates_out() -> None:
    answered = [_episode(_turn(hits=0))]
    # the environment tells: no hit; no episode called
    assert tool_use_rates(answered) == {"episode_tool_hit_frac": 0.0, "episode_tool_call_frac": 0.0}
    assert tool_use_rates([_episode(_turn(calls=1))]).keys() == {
        "tool_call_correct_rate",
        "tool_call_malformed_rate",
        "episode_tool_call_frac",
    }
    prompt = Prompt("p", (1, 2), "3")
    group = Group(prompt, (answered[0].to_completion(),), (0.0,), 0, trajectories=tuple(answered))
    assert episode_metrics([group])["episode_turns_mean"] == 1.0


def test_the_held_out_evaluation_reports_tool_use() -> None:
    episode = _episode(_turn(calls=1, hits=1), _turn(hits=0))

    async def workflow(engine, prompt, sampling, n, score, start_version, on_sample_done=None):
        completions = tuple(episode.to_completion() for _ in range(n))
        return Group(prompt, completions, (1.0,) * n, 0, trajectories=(episode,) * n)

    prompts = [Prompt(f"p{i}", (1, 2), "3") for i in range(4)]
    result = asyncio.run(
        evaluate(None, prompts, None, greedy=True, max_new_tokens=4, samples_per_prompt=1, workflow=workflow)  # type: ignore[arg-type]
    )
    assert result["accuracy"] == 1.0 and result["tool_call_hit_rate"] == 1.0 and result["episode_turns_mean"] == 2.0


def test_the_held_out_evaluation_reports_each_kind_apart() -> None:
    """Prompts with ``meta[KIND_KEY]``: accuracy and hit rate per kind beside the whole set's; without: none."""
    solved = _episode(_turn(calls=1, hits=1), _turn(hits=0))
    missed = _episode(_turn(hits=0))  # answered at once, no call

    async def workflow(engine, prompt, sampling, n, score, start_version, on_sample_done=None):
        right = prompt.meta.get(KIND_KEY) == "mul 3x2"
        episode = solved if right else missed
        completions = tuple(episode.to_completion() for _ in range(n))
        return Group(prompt, completions, (float(right),) * n, 0, trajectories=(episode,) * n)

    kinds = ["mul 3x2", "mul 3x2", "sub 3-3", "sub 3-3", "sub 3-3"]
    prompts = [Prompt(f"p{i}", (1, 2), "3", {KIND_KEY: k}) for i, k in enumerate(kinds)]
    kwargs = {"greedy": True, "max_new_tokens": 4, "samples_per_prompt": 1, "workflow": workflow}
    result = asyncio.run(evaluate(None, prompts, None, **kwargs))  # type: ignore[arg-type]
    assert result["accuracy"] == pytest.approx(2 / 5) and result["tool_call_hit_rate"] == 1.0
    assert result["episode_tool_call_frac"] == pytest.approx(2 / 5)
    assert result["by_kind"] == {
        "mul 3x2": {
            "prompts": 2.0,
            "accuracy": 1.0,
            "tool_call_hit_rate": 1.0,
            "tool_call_malformed_rate": 0.0,
            "episode_tool_call_frac": 1.0,
        },
        "sub 3-3": {"prompts": 3.0, "accuracy": 0.0, "episode_tool_call_frac": 0.0},  # no call: no per-call rate
    }
    sampled = asyncio.run(evaluate(None, prompts, None, **{**kwargs, "greedy": False, "samples_per_prompt": 3}))  # type: ignore[arg-type]
    assert sampled["by_kind"]["mul 3x2"]["accuracy"] == 1.0 and sampled["by_kind"]["sub 3-3"]["prompts"] == 3.0
    plain = [Prompt(f"p{i}", (1, 2), "3") for i in range(3)]
    assert "by_kind" not in asyncio.run(evaluate(None, plain, None, **kwargs))  # type: ignore[arg-type]
    # a dataset row's own "kind" field (any type) is not the calculator's and adds nothing
    rows = [Prompt(f"p{i}", (1, 2), "3", {"kind": k}) for i, k in enumerate(["a", 3, ["x"]])]
    assert "by_kind" not in asyncio.run(evaluate(None, rows, None, **kwargs))  # type: ignore[arg-type]
