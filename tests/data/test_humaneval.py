"""HumanEval loader and the acceptance run through a 2-worker RewardService: all canonical
solutions pass, none passes with the body replaced by ``return None``, in under 60 s
(reads ../shared/data)."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from pathlib import Path

import pytest

from asyncrl.data.gsm8k import default_data_dir
from asyncrl.data.humaneval import HUMANEVAL_FILE, HUMANEVAL_TASK, humaneval_test_program, load_humaneval
from asyncrl.reward.code import run_code_tests
from asyncrl.reward.service import RewardService

HUMANEVAL = default_data_dir() / HUMANEVAL_FILE
needs_data = pytest.mark.skipif(
    not HUMANEVAL.is_file(),
    reason=f"{HUMANEVAL} not found: put the shared data at ../shared/data or set ASYNCRL_DATA_DIR",
)

RECORD = {
    "task_id": "Mini/0",
    "prompt": 'def inc(x: int) -> int:\n    """Add one."""\n',
    "canonical_solution": "    return x + 1\n",
    "test": "def check(candidate):\n    assert candidate(1) == 2\n",
    "entry_point": "inc",
}


def test_test_program() -> None:
    program = humaneval_test_program(RECORD)
    assert program.startswith(RECORD["test"].rstrip()) and program.rstrip().endswith("check(inc)")
    assert run_code_tests(RECORD["prompt"] + RECORD["canonical_solution"], program).passed
    assert not run_code_tests(RECORD["prompt"] + "    return None\n", program).passed


@pytest.mark.parametrize("compress", [True, False])
def test_loader_on_a_small_file(tmp_path: Path, compress: bool) -> None:
    path = tmp_path / ("mini.jsonl.gz" if compress else "mini.jsonl")
    data = (json.dumps(RECORD) + "\n").encode()
    path.write_bytes(gzip.compress(data) if compress else data)
    (row,) = load_humaneval(path)
    assert {k: row[k] for k in RECORD} == RECORD
    assert row["id"] == "Mini/0" and row["verifier"] == HUMANEVAL_TASK["verifier"] == "code"
    assert row[HUMANEVAL_TASK["reference_key"]] == humaneval_test_program(RECORD)
    assert RECORD["prompt"] in row[HUMANEVAL_TASK["prompt_key"]]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"task_id": "x"}) + "\n")
    with pytest.raises(ValueError, match=":1:"):
        load_humaneval(bad)


@needs_data
def test_loads_all_tasks() -> None:
    rows = load_humaneval()
    assert len(rows) == 164
    assert rows[0]["task_id"] == "HumanEval/0" and rows[0]["entry_point"] == "has_close_elements"


@needs_data
def test_acceptance_canonical_pass_return_none_fail() -> None:
    rows = load_humaneval()

    async def main() -> tuple[list[float], list[float], float, float, dict[str, float]]:
        async with RewardService(num_workers=2, timeout_s=10) as svc:
            start = time.monotonic()
            canonical = await asyncio.gather(
                *(svc.score("code", r["prompt"] + r["canonical_solution"], r["reference"]) for r in rows)
            )
            t_canonical = time.monotonic() - start
            start = time.monotonic()
            broken = await asyncio.gather(
                *(svc.score("code", r["prompt"] + "    return None\n", r["reference"]) for r in rows)
            )
            t_broken = time.monotonic() - start
            assert all(r.failure is None for r in canonical + broken)
            return (
                [r.reward for r in canonical],
                [r.reward for r in broken],
                t_canonical,
                t_broken,
                svc.metrics(),
            )

    canonical, broken, t_canonical, t_broken, metrics = asyncio.run(main())
    passed = sum(canonical)
    print(
        f"HumanEval: canonical {passed:.0f}/164 in {t_canonical:.1f}s, return None {sum(broken):.0f}/164 "
        f"in {t_broken:.1f}s (2 workers), metrics {metrics}"
    )
    assert passed == 164, [r["task_id"] for r, x in zip(rows, canonical, strict=True) if x != 1.0]
    assert sum(broken) == 0
    # a hang guard only (each run has its own 10 s clock); the times are printed above, speed is a benchmark's
    assert t_canonical < 600 and t_broken < 600


@needs_data
def test_chat_style_completions_are_scored() -> None:
    """A completion with the whole function in a fence, as chat models answer, passes."""
    rows = load_humaneval(limit=3)

    async def main() -> list[float]:
        async with RewardService(num_workers=2, timeout_s=10, preload=()) as svc:
            results = []
            for r in rows:
                whole = r["prompt"].split("def " + r["entry_point"])[0]  # imports and helpers
                signature = r["prompt"][len(whole) :].split('"""')[0].split("'''")[0]
                fenced = f"Here you go:\n```python\n{signature.rstrip()}\n{r['canonical_solution']}```\n"
                results.append((await svc.score("code", fenced, r["reference"], row=r)).reward)
            return results

    assert asyncio.run(main()) == [1.0, 1.0, 1.0]
