"""``benchmarks.tuning``: the table of final accuracy per (arm, step size) over the tuning seeds, the best step size
per arm, and the progress file (replaced whole, refused when an invocation would overwrite another's rows)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.config import ConfigError
from benchmarks import tuning


def _row(arm: int, lr: float, seed: int, after: float | None, lag: int = 0) -> dict:
    return {"arm": arm, "lr": lr, "seed": seed, "accuracy_after": after, "lag": lag}


def test_the_table_counts_finished_rows_of_the_tuning_seeds_only_and_the_best_is_the_highest_mean() -> None:
    rows = [
        _row(0, 1e-4, 0, 0.5),
        _row(0, 1e-4, 1, 0.7),
        _row(0, 2e-4, 0, 0.6),
        _row(0, 2e-4, 1, 0.6),
        _row(0, 2e-4, 9, 0.0),  # not a tuning seed
        _row(0, 2e-4, 1, 0.0, lag=4),  # left out by ``keep``
        _row(4, 1e-4, 0, None),  # unfinished
        _row(4, 2e-4, 0, 0.3),
    ]
    table = tuning.tuning_table(rows, "arm", (0, 4), (1e-4, 2e-4), (0, 1), keep=lambda r: r["lag"] == 0)
    cells = {(t["arm"], t["lr"]): t for t in table}
    assert cells[(0, 2e-4)]["n"] == 2 and cells[(0, 2e-4)]["accuracy_after_mean"] == pytest.approx(0.6)
    assert cells[(4, 1e-4)]["n"] == 0 and cells[(4, 1e-4)]["accuracy_after_mean"] is None
    assert cells[(4, 2e-4)]["accuracy_after_ci95"] is None  # one seed: no interval
    assert tuning.best_lrs(table, "arm") == {0: 1e-4, 4: 2e-4}  # 0.6 against 0.6: the smaller step
    with pytest.raises(ValueError, match="no finished tuning run for 7"):
        tuning.best_lrs([{"arm": 7, "lr": 1e-4, "accuracy_after_mean": None}], "arm")


def test_the_progress_file_is_replaced_whole_and_an_unnamed_one_is_refused(tmp_path: Path) -> None:
    progress = tuning.progress_path(str(tmp_path / "out.json"), tmp_path / "runs", "headline")
    assert progress == tmp_path / "out.progress.json"
    assert tuning.progress_path(None, tmp_path / "runs", "headline") == tmp_path / "runs" / "headline.progress.json"
    tuning.write_progress(progress, {"rows": [1]})
    tuning.write_progress(progress, {"rows": [1, 2]})
    assert json.loads(progress.read_text()) == {"rows": [1, 2]} and sorted(p.name for p in tmp_path.iterdir()) == [
        "out.progress.json"
    ]
    tuning.refuse_unnamed_progress(progress, [str(progress)], "--tuning-from")  # continued from: fine
    with pytest.raises(ConfigError, match="continue with --tuning-from .*out.progress.json"):
        tuning.refuse_unnamed_progress(progress, [], "--tuning-from")
