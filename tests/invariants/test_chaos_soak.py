"""The chaos soak (``scripts/chaos_soak.py``) for half a minute: random SIGKILLs of the run, its
trainer process or a reward worker, a resume after each, a damaged newest checkpoint once, the
ledger checked after every kill and at the end. About 80-120 s on 2 busy cores (the soak phase
plus start-ups, the damaged-checkpoint resume and the final graceful stop), hence ``slow``. The
10-minute soak's result is ``docs/results/chaos_soak.json``."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.repo_paths import SCRIPTS

SCRIPT = SCRIPTS / "chaos_soak.py"


@pytest.mark.slow
def test_a_short_chaos_soak_loses_nothing_and_detects_the_damaged_checkpoint(tmp_path: Path) -> None:
    seed = int(os.environ.get("ASYNCRL_CHAOS_SEED", random.randrange(1 << 30)))
    out = tmp_path / "soak.json"
    argv = [
        sys.executable,
        str(SCRIPT),
        "--minutes",
        "0.5",
        "--seed",
        str(seed),
        "--run-dir",
        str(tmp_path / "run"),
        "--json",
        str(out),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert out.is_file(), f"seed={seed}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    result = json.loads(out.read_text())
    note = f"seed={seed}: {json.dumps({k: v for k, v in result.items() if k != 'checks'})[:3000]}"
    assert proc.returncode == 0 and result["ok"] and result["findings"] == [], note
    assert (result["lost"], result["trained_twice"], result["over_bound"], result["other_problems"]) == (0, 0, 0, 0)
    assert result["kills_total"] >= 1 and result["resumes"] >= 1 and result["ledger_checks"] >= 2, note
    assert result["corruption"]["detected"] and result["corruption"]["restored"], note
    assert result["checkpoints_failing_verification"] == 0 and result["orphan_processes"] == 0, note
    assert result["steps_trained"] > 0 and result["samples_trained"] == result["steps_trained"] * 4 * 4, note
