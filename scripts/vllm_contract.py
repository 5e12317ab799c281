"""Measure the vLLM backend's contract on this machine and write docs/results/vllm_cpu_contract.json.

Run with the vLLM environment's python (``make vllm-env`` first)::

    .venv-vllm/bin/python scripts/vllm_contract.py [--out docs/results/vllm_cpu_contract.json] [--steps 4]

Two parts, one after the other (each loads its own vLLM engine): the contract tests
(``tests/rollout/test_vllm_engine.py``, which write their numbers through ``ASYNCRL_VLLM_CONTRACT_OUT``),
then a short ``asyncrl train --set rollout.backend=vllm`` run whose ledger is checked
(``controller.ledger_checks.check_ledger(run_dir).require()``); its counts go into ``train_run``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs/results/vllm_cpu_contract.json"))
    ap.add_argument("--steps", type=int, default=4, help="training steps of the run (default 4)")
    args = ap.parse_args()
    import torch
    import vllm

    from asyncrl.controller.ledger_checks import check_ledger

    out = Path(args.out)
    tmp_out = Path(tempfile.mkdtemp(prefix="vllm-contract-")) / "result.json"
    t0 = time.perf_counter()
    tests = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "vllm",
            "tests/rollout/test_vllm_engine.py",
        ],
        cwd=ROOT,
        env={**os.environ, "ASYNCRL_VLLM_CONTRACT_OUT": str(tmp_out)},
        check=False,
    )
    result = json.loads(tmp_out.read_text()) if tmp_out.is_file() else {}
    result["tests"] = {"exit_code": tests.returncode, "wall_s": round(time.perf_counter() - t0, 1)}
    run_dir = Path(tempfile.mkdtemp(prefix="vllm-train-")) / "run"
    overrides = [
        "rollout.backend=vllm",
        f"controller.total_steps={args.steps}",
        "controller.batch_size=4",
        "rollout.group_size=4",
        "rollout.max_new_tokens=48",
        "rollout.max_slots=32",
        "controller.max_staleness=1",
        "controller.eval_every=0",
        "run.seed=0",
    ]
    cmd = [str(Path(sys.executable).parent / "asyncrl"), "train", "--run-dir", str(run_dir)]
    for o in overrides:
        cmd += ["--set", o]
    t0 = time.perf_counter()
    train = subprocess.run(cmd, cwd=ROOT, check=False)
    train_s = time.perf_counter() - t0
    report = check_ledger(run_dir, total_steps=args.steps) if train.returncode == 0 else None
    result["train_run"] = {
        "command": "asyncrl train " + " ".join(f"--set {o}" for o in overrides),
        "exit_code": train.returncode,
        "wall_s": round(train_s, 1),
        **(
            {
                "ledger_ok": report.ok,
                "admitted": report.admitted,
                "trained_samples": report.trained,
                "steps": report.steps,
                "lost": len(report.lost),
                "trained_twice": len(report.trained_twice),
                "over_bound": len(report.over_bound),
                "problems": report.problems,
            }
            if report is not None
            else {}
        ),
    }
    if report is not None:
        summary = run_dir / "summary.json"
        if summary.is_file():
            s = json.loads(summary.read_text())
            result["train_run"]["summary"] = {k: s[k] for k in sorted(s) if isinstance(s[k], int | float)}
    result["environment"] = {
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result, indent=2, sort_keys=True))
    if report is not None:
        report.require()
    return 0 if tests.returncode == 0 and train.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
