"""GSM8K loader, task fields, and the acceptance run: every test problem's gold answer in
typical response formats scores 1.0 and gold + 1 scores 0.0 (reads ../shared/data)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from asyncrl.data.gsm8k import (
    GSM8K_TASK,
    GSM8K_TEST_FILE,
    default_data_dir,
    final_answer,
    gsm8k_prompt,
    load_gsm8k,
)
from asyncrl.reward.math import math_reward

GSM8K = default_data_dir() / GSM8K_TEST_FILE
needs_data = pytest.mark.skipif(
    not GSM8K.is_file(),
    reason=f"{GSM8K} not found: put the shared data at ../shared/data or set ASYNCRL_DATA_DIR",
)


def formats(n: int, worked: str) -> dict[str, str]:
    """Typical ways a model states a final answer (thousands separators where they apply)."""
    s = f"{n:,}"
    return {
        "boxed": f"Let me work it out step by step.\nSo the result is \\boxed{{{s}}}.",
        "boxed_latex": f"Therefore the answer is $\\boxed{{{n}}}$.",
        "gsm8k_hashes": f"{worked}\n#### {s}",
        "answer_is": f"Adding it all up. The answer is {s}.",
        "final_answer_colon": f"Final answer: {s}",
        "sentence": f"Putting everything together, the total comes to {s}.",
        "latex_inline": f"The final answer is ${s}$.",
    }


def test_default_data_dir_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ASYNCRL_DATA_DIR", str(tmp_path))
    assert default_data_dir() == tmp_path
    monkeypatch.delenv("ASYNCRL_DATA_DIR")
    assert default_data_dir().parts[-2:] == ("shared", "data")


def test_final_answer() -> None:
    assert final_answer("a\nb\n#### 1,234") == "1234"
    assert final_answer("#### -3") == "-3"
    with pytest.raises(ValueError):
        final_answer("no marker")


def test_loader_on_a_small_file(tmp_path: Path) -> None:
    path = tmp_path / "gsm8k_mini.jsonl"
    records = [{"question": "Q1?", "answer": "w\n#### 1,500"}, {"question": "Q2?", "answer": "#### 7"}]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    rows = load_gsm8k(path)
    assert [r["id"] for r in rows] == ["gsm8k_mini-0", "gsm8k_mini-1"]
    assert rows[0]["answer"] == "1500" and rows[0]["solution"] == "w\n#### 1,500"
    assert rows[0]["prompt"] == gsm8k_prompt("Q1?") and "\\boxed{}" in rows[0]["prompt"]
    assert rows[0][GSM8K_TASK["reference_key"]] == "1500" and rows[0]["verifier"] == GSM8K_TASK["verifier"]
    assert len(load_gsm8k(path, limit=1)) == 1
    path.write_text('{"question": "Q", "answer": "no final"}\n')
    with pytest.raises(ValueError, match=":1:"):
        load_gsm8k(path)
    path.write_text("not json\n")
    with pytest.raises(ValueError):
        load_gsm8k(path)


@needs_data
def test_loads_the_test_split() -> None:
    rows = load_gsm8k()
    assert len(rows) == 1319
    assert len({r["id"] for r in rows}) == 1319
    assert rows[0]["answer"] == "18"
    assert all("," not in r["answer"] and r["answer"].lstrip("-").isdigit() for r in rows)


@needs_data
def test_acceptance_all_formats_right_and_off_by_one_wrong() -> None:
    rows = load_gsm8k()
    start = time.monotonic()
    right = dict.fromkeys(formats(0, ""), 0)
    wrong_scored = dict.fromkeys(formats(0, ""), 0)
    misses: list[str] = []
    for row in rows:
        gold = int(row["answer"])
        worked = row["solution"].rsplit("####", 1)[0].strip()
        for name, response in formats(gold, worked).items():
            if math_reward(response, row["answer"]) == 1.0:
                right[name] += 1
            else:
                misses.append(f"{row['id']} {name}")
        for name, response in formats(gold + 1, worked).items():
            if math_reward(response, row["answer"]) != 0.0:
                wrong_scored[name] += 1
                misses.append(f"{row['id']} {name} (gold+1 scored)")
        assert math_reward(row["solution"], row["answer"]) == 1.0, row["id"]
    elapsed = time.monotonic() - start
    print(f"GSM8K {len(rows)} problems: right {right}, gold+1 scored {wrong_scored}, {elapsed:.1f}s")
    assert not misses, misses[:20]
    assert all(v == len(rows) for v in right.values())
