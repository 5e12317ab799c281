"""GSM8K: the loader, the task config, and where the shared data directory is.

``load_gsm8k`` reads the official JSONL (``{"question", "answer"}`` where ``answer`` is the worked
solution ending in ``#### n``) into plain rows. Each row also carries what ``asyncrl eval`` and
``asyncrl train`` need to use it with any local model: ``prompt`` (the instruction text, before
any chat template), ``verifier`` (``"math"``) and ``reference`` (what the verifier compares to),
so a consumer does ``score(row["verifier"], completion, row["reference"], prompt=row["prompt"],
row=row)``. :data:`GSM8K_TASK` names these fields for config-driven code.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from asyncrl.data.rows import bad_row, iter_jsonl

GSM8K_TEST_FILE = "gsm8k_test.jsonl"
DATA_DIR_ENV = "ASYNCRL_DATA_DIR"

PROMPT_TEMPLATE = "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
"""Instruction for a chat or base model; the math verifier also accepts ``#### n`` and "The
answer is n" (and the last number in the response as a fallback)."""

GSM8K_TASK: dict[str, Any] = {
    "name": "gsm8k",
    "file": GSM8K_TEST_FILE,
    "id_key": "id",
    "prompt_key": "prompt",
    "reference_key": "reference",
    "verifier": "math",
}
"""Task config: which row fields hold the prompt id, the prompt text and the reference, and which
verifier scores a completion."""

_FINAL = re.compile(r"####\s*(.+?)\s*$", re.S)


def default_data_dir() -> Path:
    """Where the shared datasets live: ``$ASYNCRL_DATA_DIR`` if set, else ``../shared/data``
    relative to the repository root (the directory holding ``pyproject.toml`` above this file),
    else ``../shared/data`` relative to the working directory. The path may not exist."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser()
    candidates = []
    for parent in Path(__file__).resolve().parents:
        if (parent / "pyproject.toml").is_file():
            candidates.append(parent.parent / "shared" / "data")
            break
    candidates.append(Path.cwd().parent / "shared" / "data")
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    return candidates[0]


def final_answer(solution: str) -> str:
    """The number after ``####`` in a GSM8K solution, thousands separators removed."""
    m = _FINAL.search(solution)
    if m is None:
        raise ValueError("GSM8K solution has no '#### <answer>' line")
    return m.group(1).replace(",", "").strip()


def gsm8k_prompt(question: str) -> str:
    """The instruction text for one question (no chat template applied)."""
    return PROMPT_TEMPLATE.format(question=question.strip())


def load_gsm8k(path: str | os.PathLike[str] | None = None, *, limit: int | None = None) -> list[dict[str, Any]]:
    """Rows of a GSM8K JSONL file (default: ``default_data_dir() / "gsm8k_test.jsonl"``).

    Each row: ``id`` (``<file stem>-<line index>``), ``question``, ``answer`` (the final number as
    a string, commas removed), ``solution`` (the full worked solution), ``prompt``, ``reference``
    (= ``answer``) and ``verifier`` (``"math"``). Raises ``DatasetError`` naming the line of a bad record.
    """
    file = Path(path) if path is not None else default_data_dir() / GSM8K_TEST_FILE
    rows: list[dict[str, Any]] = []
    for lineno, record in iter_jsonl(file):
        if limit is not None and len(rows) >= limit:
            break
        question, solution = record.get("question"), record.get("answer")
        if not isinstance(question, str) or not isinstance(solution, str):
            raise bad_row(file, lineno, "not a GSM8K record (`question` and `answer` must be strings)")
        try:
            answer = final_answer(solution)
        except ValueError as e:
            raise bad_row(file, lineno, f"not a GSM8K record ({e})") from e
        rows.append(
            {
                "id": f"{file.stem}-{len(rows)}",
                "question": question,
                "answer": answer,
                "solution": solution,
                "prompt": gsm8k_prompt(question),
                "reference": answer,
                "verifier": "math",
            }
        )
    return rows
