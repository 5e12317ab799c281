"""``asyncrl bench agent-learning``'s analysis: a seed's row from its run's summary and metrics (gain in
points, tool-use rates before and after, wall times with the warm start, the budget check, the curve
on the wall clock since the warm start began, each problem kind apart), means with 95% intervals, the
seeds meeting the criterion, and the plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.config import ConfigError
from benchmarks import agent_learning
from benchmarks.agent_learning import (
    analyse,
    check_task,
    gain_made_of,
    merge_results,
    plot_curves,
    run_agent_learning_bench,
    seed_row,
    task_label,
)
from benchmarks.stats import t95
from tests.repo_paths import CONFIGS


def _summary(
    before: float,
    after: float,
    hit_before: float,
    hit_after: float,
    rl_s: float,
    calling: tuple[float, float] = (0.3, 0.8),
) -> dict:
    return {
        "accuracy_before": before,
        "accuracy_after": after,
        "accuracy_mode": "greedy",
        "eval_before": {
            "accuracy": before,
            "tool_call_hit_rate": hit_before,
            "tool_call_correct_rate": 0.9,
            "episode_turns_mean": 2.0,
            "episode_tool_call_frac": calling[0],
        },
        "eval_after": {
            "accuracy": after,
            "tool_call_hit_rate": hit_after,
            "tool_call_correct_rate": 1.0,
            "episode_turns_mean": 2.0,
            "episode_tool_call_frac": calling[1],
        },
        "steps": 30,
        "rl_wall_s": rl_s,
        "wall_s": rl_s + 20.0,
    }


METRICS = [
    {
        "step": 10,
        "time_s": 100.0,
        "eval_accuracy": 0.3,
        "eval_tool_call_hit_rate": 0.35,
        "eval_episode_tool_call_frac": 0.5,
    },
    {"step": 11},
]


def test_a_seed_row() -> None:
    row = seed_row(3, _summary(0.1, 0.35, 0.2, 0.5, 300.0), METRICS, warm_start_s=200.0, budget_s=600.0)
    assert row["gain_points"] == pytest.approx(25.0)
    assert row["tool_call_hit_rate_before"] == 0.2 and row["tool_call_hit_rate_after"] == 0.5
    assert row["tool_call_malformed_rate_after"] is None  # not measured: None, never 0
    assert row["train_wall_s"] == 500.0 and row["total_wall_s"] == 520.0 and row["within_budget"]
    assert row["curve"] == [(200.0, 0.1, 0.2, 0.3), (300.0, 0.3, 0.35, 0.5), (500.0, 0.35, 0.5, 0.8)]
    assert row["episode_tool_call_frac_before"] == 0.3 and row["episode_tool_call_frac_after"] == 0.8
    late = seed_row(3, _summary(0.1, 0.35, 0.2, 0.5, 450.0), METRICS, warm_start_s=200.0, budget_s=600.0)
    assert not late["within_budget"]


def test_analysis_over_seeds(tmp_path) -> None:
    rows = [
        seed_row(0, _summary(0.10, 0.40, 0.2, 0.5, 300.0), METRICS, 200.0, 600.0),  # +30, in budget
        seed_row(1, _summary(0.10, 0.25, 0.2, 0.4, 300.0), METRICS, 200.0, 600.0),  # +15
        seed_row(2, _summary(0.10, 0.40, 0.3, 0.3, 500.0, (0.5, 0.4)), METRICS, 200.0, 600.0),  # over budget
    ]
    result = analyse(rows, 600.0)
    gain = result["summary"]["gain_points"]
    half = t95(2) * 5.0  # gains 30, 15, 30: std sqrt(75), standard error 5
    assert gain["n"] == 3 and gain["mean"] == pytest.approx(25.0)
    assert gain["low"] == pytest.approx(25.0 - half) and gain["high"] == pytest.approx(25.0 + half)
    assert result["criterion"]["seeds_met"] == [0]
    assert result["criterion"]["seeds_hit_rate_rose"] == [0, 1]
    assert result["criterion"]["seeds_episode_tool_call_frac_rose"] == [0, 1]  # seed 2 called less
    assert result["summary"]["episode_tool_call_frac_after"]["mean"] == pytest.approx(2.0 / 3)
    assert result["summary"]["warm_start_s"]["mean"] == 200.0
    plot_curves(rows, tmp_path / "curves.png", 600.0)
    assert (tmp_path / "curves.png").read_bytes().startswith(b"\x89PNG")


def test_each_invocation_writes_under_a_fresh_directory(tmp_path, monkeypatch) -> None:
    """Two invocations with the same ``out_dir`` (the CLI's default) keep both seeds' directories."""
    seed_dirs: list[Path] = []

    def fake_seed(config, overrides, seed: int, out: Path, budget_s: float) -> dict:
        seed_dirs.append(out / f"seed{seed}")
        seed_dirs[-1].mkdir(parents=True)  # an existing one (an earlier run's) raises
        return seed_row(seed, _summary(0.1, 0.3, 0.2, 0.4, 100.0), METRICS, 50.0, budget_s)

    monkeypatch.setattr(agent_learning, "_run_seed", fake_seed)
    for _ in range(2):
        run_agent_learning_bench(None, config=None, overrides=[], seeds=[0], out_dir=str(tmp_path / "bench"))
    first, second = seed_dirs
    assert first != second and first.parent.parent == second.parent.parent == tmp_path / "bench"


def _kinds(mul: float, sub: float) -> dict:
    return {
        "mul 3x2": {"prompts": 58.0, "accuracy": mul, "tool_call_hit_rate": mul},
        "sub 3-3": {"prompts": 66.0, "accuracy": sub, "tool_call_hit_rate": 0.9},
    }


def test_each_kind_is_carried_before_during_and_after() -> None:
    """A whole-set gain made of one kind rising while another collapses shows as such."""
    summary = _summary(0.30, 0.40, 0.5, 0.5, 300.0)
    summary["eval_before"]["by_kind"], summary["eval_after"]["by_kind"] = _kinds(0.5, 0.4), _kinds(0.95, 0.0)
    metrics = [{**METRICS[0], "eval_by_kind": _kinds(0.8, 0.2)}, METRICS[1]]
    row = seed_row(0, summary, metrics, warm_start_s=200.0, budget_s=600.0)
    assert row["by_kind_before"]["sub 3-3"]["accuracy"] == 0.4 and row["by_kind_after"]["sub 3-3"]["accuracy"] == 0.0
    assert row["kind_gain_points"] == pytest.approx({"mul 3x2": 45.0, "sub 3-3": -40.0})
    assert row["kinds_fell"] == ["sub 3-3"]
    assert row["curve_by_kind"] == [
        (200.0, {"mul 3x2": 0.5, "sub 3-3": 0.4}),
        (300.0, {"mul 3x2": 0.8, "sub 3-3": 0.2}),
        (500.0, {"mul 3x2": 0.95, "sub 3-3": 0.0}),
    ]
    other = seed_row(1, summary, METRICS, warm_start_s=200.0, budget_s=600.0)  # kinds before and after only
    assert [t for t, _ in other["curve_by_kind"]] == [200.0, 500.0]
    kinds = analyse([row, other], 600.0)["summary"]["by_kind"]
    assert kinds["sub 3-3"]["accuracy_before"]["mean"] == 0.4 and kinds["sub 3-3"]["gain_points"]["n"] == 2
    assert kinds["mul 3x2"]["accuracy_after"]["mean"] == 0.95
    assert kinds["mul 3x2"]["tool_call_hit_rate_before"]["mean"] == 0.5  # per kind: the calls' hit rate as well
    assert kinds["sub 3-3"]["tool_call_hit_rate_after"]["mean"] == pytest.approx(0.9)
    plain = seed_row(2, _summary(0.1, 0.3, 0.2, 0.4, 100.0), METRICS, 50.0, 600.0)  # a task without kinds
    assert plain["by_kind_before"] is None and plain["kinds_fell"] == [] and plain["curve_by_kind"] == []
    assert "by_kind" not in analyse([plain], 600.0)["summary"]


def test_a_seed_warm_starts_on_every_usable_core_then_gives_the_threads_back(tmp_path, monkeypatch) -> None:
    """``_run_seed`` at the seams (the warm start and ``train`` faked): the warm start sees one thread per usable
    core, ``train`` (which sets ``run.torch_threads`` itself) finds the threads as they were; the row carries the
    warm start's count and statistics, and the warm start's directory is what RL starts from."""
    import torch

    from asyncrl.launch import local, stages, warm_start

    seen: dict[str, object] = {}

    def fake_warm_start(cfg, out_dir) -> dict:
        seen["warm_start_threads"] = torch.get_num_threads()
        return {"sft_loss": 0.05, "sft_restarts": 1.0}

    def fake_train(cfg):
        seen["train_threads"], seen["model_path"] = torch.get_num_threads(), cfg.model.path
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / "metrics.jsonl").write_text("")
        return run_dir, _summary(0.1, 0.3, 0.2, 0.4, 100.0)

    monkeypatch.setattr(warm_start, "run_warm_start", fake_warm_start)
    monkeypatch.setattr(local, "train", fake_train)
    monkeypatch.setattr(stages, "usable_cores", lambda: 3)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        row = agent_learning._run_seed(None, ["task.name=calculator", "rollout.workflow=agent"], 0, tmp_path, 600.0)
    finally:
        torch.set_num_threads(before)
    assert seen["warm_start_threads"] == row["warm_start_threads"] == 3
    assert seen["train_threads"] == 1  # given back, also when run.torch_threads=0 would leave it alone
    assert seen["model_path"] == str(tmp_path / "seed0" / "warm_start")
    assert row["warm_start"] == {"sft_loss": 0.05, "sft_restarts": 1.0}  # its statistics, restarts included
    assert row["gain_points"] == pytest.approx(20.0)


def _side(accuracy: float, calling: float, hitting: float) -> dict:
    return {"accuracy": accuracy, "episode_tool_call_frac": calling, "episode_tool_hit_frac": hitting}


def test_the_gain_is_split_into_calling_solving_and_answering() -> None:
    """0.3 of episodes calling, half of them hitting -> every episode calling, 0.8 hitting: the hits rose by
    0.65, 0.35 of it by calling more at the old rate and 0.30 by solving better; the answer turn added 0.05."""
    made_of = gain_made_of(_side(0.10, 0.3, 0.15), _side(0.80, 1.0, 0.80))
    assert made_of["calling_points"] == pytest.approx(35.0)
    assert made_of["solving_points"] == pytest.approx(30.0)
    assert made_of["answer_points"] == pytest.approx(5.0)
    total = made_of["calling_points"] + made_of["solving_points"] + made_of["answer_points"]
    assert total == pytest.approx(70.0)
    # a warm start that always calls: the whole gain in episodes that hit is solving
    always = gain_made_of(_side(0.40, 1.0, 0.45), _side(0.60, 1.0, 0.62))
    assert always["calling_points"] == pytest.approx(0.0) and always["solving_points"] == pytest.approx(17.0)
    assert gain_made_of(_side(0.1, 0.0, 0.0), _side(0.2, 0.5, 0.1))["calling_points"] == pytest.approx(0.0)
    assert gain_made_of({"accuracy": 0.1}, {"accuracy": 0.2}) is None  # a single-turn run: no tool figures


def test_rows_and_the_summary_carry_what_the_gain_is_made_of(tmp_path) -> None:
    def summary(hit_after: float) -> dict:
        s = _summary(0.2, 0.5, 0.5, 0.6, 300.0, calling=(1.0, 1.0))
        s["eval_before"]["episode_tool_hit_frac"], s["eval_after"]["episode_tool_hit_frac"] = 0.3, hit_after
        return s

    rows = [seed_row(s, summary(h), METRICS, 100.0, 600.0) for s, h in ((0, 0.5), (1, 0.6), (2, 0.7))]
    made_of = analyse(rows, 600.0, min_gain_points=25.0)["summary"]["gain_made_of"]
    assert made_of["solving_points"]["mean"] == pytest.approx(30.0) and made_of["solving_points"]["n"] == 3
    assert made_of["calling_points"]["mean"] == pytest.approx(0.0)
    assert made_of["answer_points"]["mean"] == pytest.approx(0.0)
    assert analyse(rows, 600.0, min_gain_points=25.0)["criterion"]["seeds_met"] == [0, 1, 2]
    assert analyse(rows, 600.0, min_gain_points=35.0)["criterion"]["seeds_met"] == []
    plot_curves(rows, tmp_path / "rg.png", 600.0, "reasoning_gym chain_sum")
    assert (tmp_path / "rg.png").read_bytes().startswith(b"\x89PNG")


def test_the_bench_runs_the_calculator_as_an_agent_and_reasoning_gym_either_way() -> None:
    check_task("calculator", "agent")
    check_task("reasoning_gym", "agent")
    check_task("reasoning_gym", "single")
    for task, workflow in (("calculator", "single"), ("arithmetic", "agent")):
        with pytest.raises(ConfigError, match=f"got task.name={task} with rollout.workflow={workflow}"):
            check_task(task, workflow)
    rg = ["task.name=reasoning_gym", "task.verifier=reasoning_gym", "task.datasets=chain_sum:max_terms=2"]
    assert task_label(None, rg) == "reasoning_gym chain_sum:max_terms=2"
    assert task_label(None, ["task.name=calculator", "rollout.workflow=agent"]) == "calculator"


def test_a_reasoning_gym_config_reaches_the_warm_start_and_train(tmp_path, monkeypatch) -> None:
    """``_run_seed`` with the shipped reasoning-gym config (warm start and ``train`` faked): the seed's config is
    the task's, its row carries the tool figures and the split of the gain."""
    from asyncrl.launch import local, warm_start

    seen: dict[str, object] = {}
    monkeypatch.setattr(warm_start, "run_warm_start", lambda cfg, out: seen.setdefault("task", cfg.task) and {})

    def fake_train(cfg):
        seen["env"], seen["seed"] = cfg.agent.env, cfg.run.seed
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "metrics.jsonl").write_text("")
        s = _summary(0.2, 0.5, 0.5, 0.6, 50.0, calling=(1.0, 1.0))
        s["eval_before"]["episode_tool_hit_frac"], s["eval_after"]["episode_tool_hit_frac"] = 0.3, 0.5
        return tmp_path / "run", s

    monkeypatch.setattr(local, "train", fake_train)
    row = agent_learning._run_seed(str(CONFIGS / "reasoning_gym_calculator.yaml"), [], 4, tmp_path, 600.0)
    assert seen["task"].name == "reasoning_gym" and "leg_counting" in seen["task"].datasets
    assert seen["env"] == "calculator" and seen["seed"] == 4
    assert row["gain_made_of"]["solving_points"] == pytest.approx(20.0)
    assert row["gain_made_of"]["answer_points"] == pytest.approx(10.0)


def test_a_single_turn_run_has_no_tool_figures_and_says_so(tmp_path, monkeypatch, capsys) -> None:
    """A single-turn reasoning-gym run evaluates no tool use: its rows carry None (never 0), the split of the gain
    is absent, and the table prints "-"."""
    single = {
        "accuracy_before": 0.1,
        "accuracy_after": 0.3,
        "accuracy_mode": "greedy",
        "steps": 10,
        "rl_wall_s": 50.0,
        "wall_s": 60.0,
        "eval_before": {"accuracy": 0.1},
        "eval_after": {"accuracy": 0.3},
    }

    def fake_seed(config, overrides, seed: int, out: Path, budget_s: float) -> dict:
        return seed_row(seed, single, [], 20.0, budget_s)

    monkeypatch.setattr(agent_learning, "_run_seed", fake_seed)
    rg = ["task.name=reasoning_gym", "task.verifier=reasoning_gym", "task.datasets=chain_sum"]
    payload = run_agent_learning_bench(None, config=None, overrides=rg, seeds=[0, 1], out_dir=str(tmp_path))
    assert payload["task"] == "reasoning_gym chain_sum"
    row = payload["rows"][0]
    assert row["tool_call_hit_rate_before"] is None and row["gain_made_of"] is None
    assert "gain_made_of" not in payload["summary"] and "tool_call_hit_rate_before" not in payload["summary"]
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("   0"))
    assert line.split()[4:8] == ["-", "-", "-", "-"]


def test_results_run_apart_merge_into_one_analysis(tmp_path) -> None:
    """Seeds run in separate processes (a result file each) give the analysis one invocation of all of them
    would; files of another configuration, or a seed twice, are refused in one line."""

    rows = [
        seed_row(s, _summary(0.1, 0.1 + g, 0.2, 0.4, 100.0), METRICS, 50.0, 600.0)
        for s, g in ((0, 0.30), (1, 0.15), (2, 0.30))
    ]
    head = {
        "bench": "agent-learning",
        "task": "reasoning_gym chain_sum",
        "config": "c.yaml",
        "overrides": [],
        "budget_s": 600.0,
    }
    paths = []
    for row in rows:
        paths.append(str(tmp_path / f"seed{row['seed']}.json"))
        Path(paths[-1]).write_text(json.dumps({**head, "rows": [row], **analyse([row], 600.0)}))
    merged = merge_results(paths)
    assert merged["merged_from"] == paths and [r["seed"] for r in merged["rows"]] == [0, 1, 2]
    whole = analyse(json.loads(json.dumps(rows)), 600.0)
    assert merged["summary"]["gain_points"] == whole["summary"]["gain_points"]
    assert merged["summary"]["gain_points"]["n"] == 3 and merged["criterion"]["seeds_met"] == [0, 2]
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**head, "overrides": ["trainer.lr=1e-3"], "rows": [rows[0]]}))
    with pytest.raises(ConfigError, match="differs from .* in overrides"):
        merge_results([paths[1], str(other)])
    with pytest.raises(ConfigError, match="a seed appears twice"):
        merge_results([paths[0], paths[0]])
