"""HumanEval: the loader, the test program builder and the task config.

``load_humaneval`` reads ``HumanEval.jsonl.gz`` (or a plain ``.jsonl``) into rows with the
official fields (``task_id``, ``prompt``, ``canonical_solution``, ``test``, ``entry_point``) plus
``id``, ``instruction`` (a chat-style request to complete the function), ``reference`` (the test
program from :func:`humaneval_test_program`) and ``verifier`` (``"code"``).

The ``code`` verifier receives the completion, the reference and the row: because the row has
``prompt`` and ``entry_point``, a completion that is only the function body continues the prompt,
and one that defines the whole function (fenced or not) runs after the prompt's imports and
helpers (see ``asyncrl.reward.code.build_program``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from asyncrl.data.gsm8k import default_data_dir
from asyncrl.data.rows import bad_row, iter_jsonl

HUMANEVAL_FILE = "HumanEval.jsonl.gz"

INSTRUCTION_TEMPLATE = (
    "Complete the following Python function. Answer with the complete function in one "
    "```python``` code block.\n\n```python\n{prompt}```"
)

HUMANEVAL_TASK: dict[str, Any] = {
    "name": "humaneval",
    "file": HUMANEVAL_FILE,
    "id_key": "id",
    "prompt_key": "instruction",
    "completion_prompt_key": "prompt",
    "reference_key": "reference",
    "verifier": "code",
}
"""Task config: ``prompt_key`` for chat/instruct models; base models continue ``prompt`` itself
(``completion_prompt_key``)."""

_FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")


def humaneval_test_program(row: dict[str, Any]) -> str:
    """The test code run after a candidate program: the task's ``check`` and a call of it on the
    entry point."""
    return f"{row['test'].rstrip()}\n\n\ncheck({row['entry_point']})\n"


def load_humaneval(path: str | os.PathLike[str] | None = None, *, limit: int | None = None) -> list[dict[str, Any]]:
    """Rows of HumanEval (default: ``default_data_dir() / "HumanEval.jsonl.gz"``); ``.gz`` is
    decompressed. Raises ``DatasetError`` naming the line of a bad record."""
    file = Path(path) if path is not None else default_data_dir() / HUMANEVAL_FILE
    rows: list[dict[str, Any]] = []
    for lineno, record in iter_jsonl(file):
        if limit is not None and len(rows) >= limit:
            break
        missing = [k for k in _FIELDS if not isinstance(record.get(k), str)]
        if missing:
            raise bad_row(file, lineno, f"not a HumanEval record (missing or non-string fields {missing})")
        row = {k: record[k] for k in _FIELDS}
        row["id"] = row["task_id"]
        row["instruction"] = INSTRUCTION_TEMPLATE.format(prompt=row["prompt"])
        row["reference"] = humaneval_test_program(row)
        row["verifier"] = "code"
        rows.append(row)
    return rows
