"""Episodes waiting on tools: the ledger's ``tool_wait`` on the RL clock (only turns with tool calls),
how many episodes wait at each moment, the share of the episodes' time in flight spent waiting, and the
report's timeline drawing them beside the engine's running samples; a run of the real loop (scripted
engine and trainer) records each wait where it happened on its RL clock."""

from __future__ import annotations

import asyncio
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

import asyncrl.controller.report as report  # noqa: E402
from asyncrl.config import load_config, to_dict  # noqa: E402
from asyncrl.controller.loop import Controller  # noqa: E402
from asyncrl.controller.rundir import RunDir, episode_entry, read_jsonl  # noqa: E402
from asyncrl.controller.tool_waits import tool_wait_share, tool_waits, waiting_over_time  # noqa: E402
from asyncrl.data.prompts import PromptSource  # noqa: E402
from asyncrl.launch.runner import loop_settings  # noqa: E402
from asyncrl.types import EnvSegment, Group, ModelSegment, Prompt, Trajectory, TurnRecord  # noqa: E402
from tests.controller.fakes import ScriptedEngine, ScriptedTrainer  # noqa: E402


def _episode() -> Trajectory:
    call = TurnRecord(2, 1, 0, 0, "stop", tool_calls=("calculator",), tool_latency_s=0.5, tool_started_at=1000.25)
    answer = TurnRecord(2, 0, 0, 0, "stop", tool_latency_s=0.001, tool_started_at=1001.0)  # no call: no wait
    segments = (
        ModelSegment((5, 6), (-0.1, -0.2), (0, 0), "stop"),
        EnvSegment((7,), "tool"),
        ModelSegment((8, 9), (-0.1, -0.2), (0, 0), "stop"),
    )
    return Trajectory(prompt_ids=(1, 2), segments=segments, turns=(call, answer), end="answer", env_reward=1.0)


def test_the_ledger_puts_tool_waits_on_the_rl_clock() -> None:
    entry = episode_entry(_episode(), rl_offset=-990.0)  # RL time = wall time - 990
    call, answer = entry["turns"]
    assert call["tool_wait"] == pytest.approx([10.25, 10.75]) and call["tool_latency_s"] == 0.5
    assert "tool_wait" not in answer
    assert all("tool_wait" not in t for t in episode_entry(_episode())["turns"])  # no clock: no interval


def test_waiting_over_time_counts_overlapping_waits() -> None:
    ledger = [
        {"status": "trained", "turns": [{"tool_wait": [1.0, 3.0]}, {"tool_calls": []}]},
        {"status": "trained", "turns": [{"tool_wait": [0.0, 2.0]}, {"tool_wait": [3.0, 4.0]}]},
        {"status": "admitted"},
    ]
    waits = tool_waits(ledger)
    assert waits == [(0.0, 2.0), (1.0, 3.0), (3.0, 4.0)]
    times, counts = waiting_over_time(waits)
    assert times == [0.0, 1.0, 2.0, 3.0, 4.0] and counts == [1, 2, 1, 1, 0]  # at 3.0 one ends, one starts
    assert waiting_over_time([]) == ([], [])


def test_tool_wait_share_of_the_time_in_flight() -> None:
    timeline = [{"t": 0.0, "generating_samples": 2}, {"t": 5.0, "generating_samples": 2}, {"t": 10.0}]
    ledger = [{"turns": [{"tool_wait": [1.0, 3.0]}]}, {"turns": [{"tool_wait": [2.0, 6.0]}]}]
    assert tool_wait_share(ledger, timeline) == pytest.approx(6.0 / 20.0)  # 2 episodes in flight for 10 s
    assert tool_wait_share(ledger, timeline, end_s=5.0) == pytest.approx(5.0 / 10.0)  # waits clipped at 5 s
    assert tool_wait_share([], timeline) == 0.0
    assert tool_wait_share(ledger, timeline[:1]) is None
    assert tool_wait_share(ledger, [{"t": 0.0, "generating_samples": 0}, {"t": 1.0}]) is None


def test_the_timeline_draws_episodes_waiting_on_a_tool(tmp_path, monkeypatch) -> None:
    metrics = [{"time_s": 4.0, "train_start_s": 3.0, "train_step_s": 0.5, "weight_sync_s": 0.1}]
    timeline = [
        {
            "t": float(t),
            "engine_running": 1,
            "engine_waiting": 0,
            "reward_in_flight": 0,
            "buffer_groups": 0,
            "running_groups": 1,
        }
        for t in range(5)
    ]
    saved = []
    real_save = report.save_figure
    monkeypatch.setattr(report, "save_figure", lambda fig, path: saved.append(fig) or real_save(fig, path))
    path = report._timeline(plt, metrics, timeline, {}, tmp_path / "timeline.png", [(0.5, 2.0), (1.0, 2.5)])
    assert path.stat().st_size > 0
    engine = saved[0].axes[0]
    labels = [c.get_label() for c in engine.collections]
    assert "episodes waiting on a tool" in labels
    hatched = engine.collections[labels.index("episodes waiting on a tool")]
    assert hatched.get_hatch() == "///"
    top = max(v[1] for p in hatched.get_paths() for v in p.vertices)
    assert top == 2  # two episodes waited at once
    report._timeline(plt, metrics, timeline, {}, tmp_path / "plain.png", [])
    assert "episodes waiting on a tool" not in [c.get_label() for c in saved[1].axes[0].collections]


def test_a_run_records_each_wait_where_it_happened_on_the_rl_clock(tmp_path) -> None:
    """The real loop over the scripted engine and trainer, with a workflow whose every episode waits 20 ms on
    a tool: each ledger interval starts where the recorder's RL clock stood when the wait began."""
    cfg = load_config(
        None,
        [
            "controller.batch_size=2",
            "controller.max_staleness=1",
            "controller.total_steps=3",
            "controller.high_water_batches=0",
            "controller.checkpoint_every=0",
            "rollout.group_size=2",
            "algo.filter_equal_rewards=false",
            "run.progress=false",
        ],
    )
    seen: dict[tuple[str, int], tuple[float, float]] = {}  # (prompt, episode) -> RL time either side of the start
    engine, controllers = ScriptedEngine(), []

    async def workflow(engine, prompt, sampling, group_size, score, start_version, on_sample_done=None) -> Group:
        async def episode(i: int) -> Trajectory:
            before = controllers[0].recorder.now()
            started_at, clock = time.time(), time.monotonic()
            seen[(prompt.prompt_id, i)] = (before, controllers[0].recorder.now())  # RL time either side
            await asyncio.sleep(0.02)
            v = engine.version
            turn = TurnRecord(
                1,
                1,
                v,
                v,
                "stop",
                tool_calls=("calculator",),
                tool_latency_s=time.monotonic() - clock,
                tool_started_at=started_at,
            )
            segments = (
                ModelSegment((3,), (-0.5,), (v,), "stop"),
                EnvSegment((4,), "tool"),
                ModelSegment((5 + i,), (-0.5,), (v,), "stop"),
            )
            return Trajectory(prompt.token_ids, segments, (turn,), "answer", float(i))

        trajectories = tuple(await asyncio.gather(*(episode(i) for i in range(group_size))))
        return Group(
            prompt,
            tuple(t.to_completion() for t in trajectories),
            tuple(float(i) for i in range(group_size)),
            start_version,
            (None,) * group_size,
            trajectories,
        )

    async def unscored(prompt: Prompt, completion: object) -> tuple[float, str | None]:
        raise AssertionError("the workflow scores its episodes")

    async def main() -> None:
        rundir = RunDir(tmp_path, to_dict(cfg), tensorboard=False)
        source = PromptSource([Prompt(f"p{i}", (i + 1,), "1") for i in range(40)], 0)
        controllers.append(
            Controller(loop_settings(cfg), engine, ScriptedTrainer(), source, unscored, rundir, workflow=workflow)
        )
        try:
            await asyncio.wait_for(controllers[0].run(), 120)  # a hang guard
        finally:
            rundir.close()

    asyncio.run(main())
    trained = [r for r in read_jsonl(tmp_path / "trajectories.jsonl") if r["status"] == "trained"]
    assert len(trained) == 3 * 2 * 2
    for line in trained:
        (turn,) = line["turns"]
        start, end = turn["tool_wait"]
        before, after = seen[(line["prompt_id"], line["sample_idx"])]
        assert before - 0.01 <= start <= after + 0.01  # 0.01: rounding and the recorder's own clock reading
        assert end - start == pytest.approx(turn["tool_latency_s"], abs=2e-4) and turn["tool_latency_s"] >= 0.02
