"""``asyncrl train --resume RUN``: the run's saved config, then ``--config`` and ``--set`` on top."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import asyncrl.launch.local
from asyncrl.cli import main
from asyncrl.config import Config, dump_yaml, load_config


@pytest.fixture
def trained(monkeypatch: pytest.MonkeyPatch) -> list[Config]:
    """The configs ``asyncrl train`` hands to the launcher (which does nothing here)."""
    seen: list[Config] = []

    def train(
        cfg: Config, resume: bool = False, overwrite: bool = False, allow_change: tuple[str, ...] = ()
    ) -> tuple[Path, dict[str, Any]]:
        assert resume
        seen.append(cfg)
        summary = dict.fromkeys(("accuracy_before", "accuracy_after", "wall_s", "trained_tokens_per_s"), 0.0)
        return Path(cfg.run.run_dir), {**summary, "steps": 0, "max_staleness_seen": 0, "stop_reason": None}

    monkeypatch.setattr(asyncrl.launch.local, "train", train)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    return seen


def _saved_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    saved = load_config(
        None, ["controller.total_steps=3", "controller.batch_size=5", "rollout.group_size=3", "rollout.temperature=0.7"]
    )
    dump_yaml(saved, run / "config.yaml")
    return run


def test_resume_layers_config_and_overrides_over_the_saved_config(tmp_path: Path, trained: list[Config]) -> None:
    run = _saved_run(tmp_path)
    more = tmp_path / "more.yaml"
    more.write_text("controller:\n  total_steps: 7\nrollout:\n  temperature: 0.9\n")
    assert main(["train", "--resume", str(run), "--config", str(more), "--set", "rollout.temperature=1.1"]) == 0
    (cfg,) = trained
    assert cfg.controller.total_steps == 7  # from --config
    assert cfg.controller.batch_size == 5 and cfg.rollout.group_size == 3  # kept from the saved run
    assert cfg.rollout.temperature == 1.1  # --set has the last word
    assert cfg.run.run_dir == str(run)


def test_resume_without_config_keeps_the_saved_config(tmp_path: Path, trained: list[Config]) -> None:
    run = _saved_run(tmp_path)
    assert main(["train", "--resume", str(run), "--set", "controller.total_steps=9"]) == 0
    (cfg,) = trained
    assert (cfg.controller.total_steps, cfg.controller.batch_size, cfg.rollout.temperature) == (9, 5, 0.7)


def test_load_config_layers_a_file_over_a_base(tmp_path: Path) -> None:
    base, top = tmp_path / "base.yaml", tmp_path / "top.yaml"
    base.write_text("controller:\n  batch_size: 5\n  total_steps: 3\n")
    top.write_text("controller:\n  total_steps: 7\n")
    cfg = load_config(top, ["controller.max_staleness=0"], base=base)
    assert (cfg.controller.batch_size, cfg.controller.total_steps, cfg.controller.max_staleness) == (5, 7, 0)
    assert load_config(None, base=base).controller.total_steps == 3
