"""Reading a dataset file row by row, with every error naming the file and the line.

Owns ``DatasetError`` (a ``ValueError`` whose message starts with ``FILE:LINE:``) and
``iter_jsonl(path)``, which yields ``(line number, record)`` for each non-blank line of a JSONL file
(``.gz`` decompressed) and raises ``DatasetError`` for a line that is not UTF-8, not JSON or not a
JSON object. The loaders (``gsm8k``, ``humaneval``, the ``jsonl`` task of ``prompts``) check the
fields of each record and raise ``DatasetError`` through ``bad_row`` the same way.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class DatasetError(ValueError):
    """A dataset file that cannot be used; the message names the file and the line."""


def bad_row(path: str | os.PathLike[str], line_no: int, what: str) -> DatasetError:
    """The error for line ``line_no`` of ``path`` (``what``: what is wrong with it)."""
    return DatasetError(f"{path}:{line_no}: {what}")


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` of every non-blank line of a JSONL file (``.gz``: decompressed)."""
    file = Path(path)
    opener: Any = gzip.open if file.suffix == ".gz" else open
    with opener(file, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                bad = raw[exc.start : exc.start + 1]
                raise bad_row(file, line_no, f"not valid UTF-8 (byte {bad!r} at column {exc.start + 1})") from exc
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise bad_row(file, line_no, f"not valid JSON ({exc.msg} at column {exc.pos + 1})") from exc
            if not isinstance(record, dict):
                raise bad_row(file, line_no, f"a row must be a JSON object, not {type(record).__name__}")
            yield line_no, record
