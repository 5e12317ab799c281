"""``python -m benchmarks sim-validate``: the measured figures of a run directory, and a simulated run (written
with the real schema and a real config) predicted by the simulator from itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.config import dump_yaml, load_config
from asyncrl.sim.profile import load_profile
from asyncrl.sim.run import simulate
from asyncrl.sim.scenario import Scenario, from_run
from benchmarks.__main__ import main
from benchmarks.sim_validate import _occupancy, measured_figures, validate_runs


def test_occupancy_is_the_time_average_of_running_over_slots() -> None:
    timeline = [{"t": 0.0, "engine_running": 4}, {"t": 1.0, "engine_running": 2}, {"t": 3.0, "engine_running": 8}]
    # 4 for 1 s, 2 for 2 s, 8 for the last 1 s up to the end at 4 s: (4 + 4 + 8) / (4 s x 8 slots)
    assert _occupancy(timeline, 4.0, 8) == pytest.approx(16 / 32)
    assert _occupancy(timeline, 0.0, 8) == 0.0


def test_occupancy_is_exact_from_the_engines_integral_where_every_line_has_it() -> None:
    # the held counts say 4 running throughout; the engine's integral says 2 on average between t=0 and 3
    timeline = [{"t": t, "engine_running": 4, "engine_running_sample_s": 10.0 + 2.0 * t} for t in (0.0, 1.0, 3.0)]
    timeline.append({"t": 5.0, "engine_running": 4, "engine_running_sample_s": 99.0})  # after the last step
    assert _occupancy(timeline, 4.0, 8) == pytest.approx(2 / 8)
    mixed = [{**timeline[0], "engine_running_sample_s": None}, *timeline[1:]]  # one line without it: held counts
    assert _occupancy(mixed, 4.0, 8) == pytest.approx(4 / 8)


def _simulated_run(path: Path, eta: int, mode: str) -> None:
    """A simulated run directory (constant lengths) given the real config of the same settings."""
    keys = dict(
        max_staleness=eta,
        interrupt_mode=mode,
        batch_size=4,
        group_size=4,
        total_steps=30,
        max_concurrent=16,
        lengths="constant",
        length_median=60,
        max_new_tokens=60,
        slots=16,
    )
    simulate(Scenario(**keys), run_dir=path)
    cfg = load_config(
        None,
        [
            f"controller.max_staleness={eta}",
            f"rollout.interrupt_mode={mode}",
            "controller.batch_size=4",
            "rollout.group_size=4",
            "controller.total_steps=30",
            "controller.max_concurrent=16",
            "rollout.max_new_tokens=60",
            "rollout.max_slots=16",
        ],
    )
    dump_yaml(cfg, path / "config.yaml")


def test_a_simulated_run_is_predicted_from_itself(tmp_path: Path) -> None:
    for eta, mode in ((0, "abort"), (2, "keep")):
        _simulated_run(tmp_path / f"eta{eta}", eta, mode)
    profile = load_profile("cpu-2core-tiny")
    out = validate_runs([tmp_path / "eta0", tmp_path / "eta2"], profile, seeds=(0,))
    assert out["runs"] == 2 and [r["max_staleness"] for r in out["rows"]] == [0, 2]
    for row in out["rows"]:
        assert row["within"], row
        assert abs(row["error"]["throughput"]) < 0.05 and abs(row["error"]["engine_occupancy"]) < 0.05
    eta0, eta2 = out["rows"]
    assert eta0["measured"]["staleness_mean"] == 0 and eta0["error"]["staleness_mean"] == 0.0
    assert eta2["measured"]["staleness_mean"] > 0
    measured = measured_figures(tmp_path / "eta2", from_run(tmp_path / "eta2"))
    assert measured.throughput == pytest.approx(eta2["measured"]["throughput"])
    # a profile refined from a run may not then be validated on it
    with pytest.raises(ValueError, match="both calibrate"):
        validate_runs([tmp_path / "eta0"], profile, calibration_runs=[tmp_path / "eta0"])


def test_the_command_prints_the_table_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _simulated_run(tmp_path / "run", 1, "abort")
    path = tmp_path / "v.json"
    args = ["sim-validate", "--runs", str(tmp_path / "run"), "--profile", "cpu-2core-tiny", "--seeds", "0"]
    assert main([*args, "--json", str(path)]) == 0
    assert "runs within 15%" in capsys.readouterr().out
    assert json.loads(path.read_text())["rows"][0]["interrupt_mode"] == "abort"
    assert main(["sim-validate"]) == 2
    assert "--runs" in capsys.readouterr().err
