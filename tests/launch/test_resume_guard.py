"""What a resume refuses (``launch.resume_guard``): changes to the keys that define a run, changes
nobody asked for, a jsonl file cut shorter or mid-line where the checkpoint counts on it, and starting
over a run that trained."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.launch.resume_guard import (
    FIXED_KEYS,
    FREE_KEYS,
    ResumeRefused,
    check_config_changes,
    check_offsets,
    check_restartable,
    is_fixed,
)


def _cfg(*overrides: str):
    return load_config(None, list(overrides))


def test_free_keys_change_without_being_asked(tmp_path: Path) -> None:
    saved = _cfg()
    new = _cfg(
        "controller.total_steps=500", "controller.max_rl_time_s=60", "run.progress=false", f"run.run_dir={tmp_path}"
    )
    changes = check_config_changes(tmp_path, saved, new)
    assert set(changes) == {"controller.total_steps", "controller.max_rl_time_s", "run.progress"}
    assert changes["controller.total_steps"] == (120, 500)


@pytest.mark.parametrize(
    "override",
    [
        "task.seed=7",
        "task.max_terms=3",
        "rollout.group_size=4",
        "controller.batch_size=8",
        "run.seed=3",
        "controller.max_staleness=1",
        "model.path=/elsewhere",
        "sft.steps=10",
    ],
)
def test_keys_that_define_the_run_never_change(tmp_path: Path, override: str) -> None:
    key = override.split("=")[0]
    with pytest.raises(ResumeRefused, match="define the run") as err:
        check_config_changes(tmp_path, _cfg(), _cfg(override), allow=("trainer",))
    assert key in str(err.value) and "--model" in str(err.value)


@pytest.mark.parametrize("override", ["trainer.lr=0.5", "rollout.temperature=0.7", "algo.eps_clip=0.3"])
def test_other_changes_need_allow_change(tmp_path: Path, override: str) -> None:
    key = override.split("=")[0]
    with pytest.raises(ResumeRefused, match=f"--allow-change {key}"):
        check_config_changes(tmp_path, _cfg(), _cfg(override))
    assert key in check_config_changes(tmp_path, _cfg(), _cfg(override), allow=(key,))
    section = key.split(".")[0]
    assert key in check_config_changes(tmp_path, _cfg(), _cfg(override), allow=(section,))


def test_allow_change_cannot_name_a_key_that_defines_the_run(tmp_path: Path) -> None:
    for allow in ("task", "task.seed", "controller.max_staleness", "model", "sft", "run.seed"):
        with pytest.raises(ResumeRefused, match="cannot change on resume"):
            check_config_changes(tmp_path, _cfg(), _cfg(), allow=(allow,))
    # a section allows its other keys; the ones that define the run stay refused
    new = _cfg("controller.max_staleness=2", "controller.episode_timeout_s=30")
    with pytest.raises(ResumeRefused, match="define the run"):
        check_config_changes(tmp_path, _cfg(), new, allow=("controller",))
    assert "controller.episode_timeout_s" in check_config_changes(
        tmp_path, _cfg(), _cfg("controller.episode_timeout_s=30"), allow=("controller",)
    )


def test_the_key_lists_are_disjoint_and_real() -> None:
    flat = set(_flat_keys())
    assert FREE_KEYS <= flat and FIXED_KEYS <= flat
    assert not any(is_fixed(k) for k in FREE_KEYS)


def _flat_keys() -> list[str]:
    from asyncrl.config import to_dict

    out: list[str] = []

    def walk(node: dict, prefix: str) -> None:
        for k, v in node.items():
            walk(v, f"{prefix}{k}.") if isinstance(v, dict) else out.append(f"{prefix}{k}")

    walk(to_dict(_cfg()), "")
    return out


def test_offsets_must_be_reached_on_a_line_end(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_bytes(b'{"a": 1}\n{"a": 2}\n')
    (tmp_path / "trajectories.jsonl").write_bytes(b'{"b": 1}\n{"b": 2}\n{"b": 3')  # a torn tail is fine
    check_offsets(tmp_path, {"metrics.jsonl": 18, "trajectories.jsonl": 18, "timeline.jsonl": 0}, tmp_path / "ck")
    with pytest.raises(ResumeRefused, match="metrics.jsonl holds 18 bytes, fewer than the 30"):
        check_offsets(tmp_path, {"metrics.jsonl": 30}, tmp_path / "ck")
    with pytest.raises(ResumeRefused, match="does not end a line at byte 12"):
        check_offsets(tmp_path, {"trajectories.jsonl": 12}, tmp_path / "ck")
    with pytest.raises(ResumeRefused, match="timeline.jsonl holds 0 bytes"):
        check_offsets(tmp_path, {"timeline.jsonl": 5}, tmp_path / "ck")


@pytest.mark.parametrize("held", ["metrics.jsonl", "summary.json", "checkpoint"])
def test_a_run_that_trained_is_never_started_over(tmp_path: Path, held: str) -> None:
    (tmp_path / "trajectories.jsonl").write_text('{"status": "admitted"}\n')
    check_restartable(tmp_path)  # admitted prompts only: nothing trained, it may start over
    if held == "checkpoint":
        (tmp_path / held).mkdir()
    else:
        (tmp_path / held).write_text("{}\n")
    with pytest.raises(ResumeRefused, match="no checkpoint to resume from"):
        check_restartable(tmp_path)


def test_a_run_that_reached_its_steps_is_not_resumed_at_that_count(tmp_path: Path) -> None:
    import json

    from asyncrl.launch.resume_guard import check_not_finished

    check_not_finished(tmp_path, 10)  # no summary: a killed run, resumable
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 10, "stop_reason": None}))
    with pytest.raises(ResumeRefused, match="already finished: it trained 10 steps"):
        check_not_finished(tmp_path, 10)
    check_not_finished(tmp_path, 12)  # more steps asked: it trains on
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 6, "stop_reason": "SIGTERM"}))
    check_not_finished(tmp_path, 10)  # a stopped run is resumed
