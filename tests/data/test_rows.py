"""Malformed dataset rows (issue 14 item 6): every loader names the file and the line of a bad row
(``data.rows.DatasetError``), for bad JSON, invalid UTF-8, a row that is not an object and fields of
the wrong type; a task with too few rows, or only over-long prompts, says so."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from asyncrl.config import ConfigError, TaskConfig
from asyncrl.data.gsm8k import load_gsm8k
from asyncrl.data.humaneval import load_humaneval
from asyncrl.data.prompts import build_task, drop_long_prompts
from asyncrl.data.rows import DatasetError, iter_jsonl
from asyncrl.models import load_tokenizer
from asyncrl.types import Prompt

GOOD = json.dumps({"prompt": "1+1", "answer": "2"})


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"{not json", r"rows.jsonl:3: not valid JSON \(Expecting property name enclosed in .* at column 2\)"),
        (b'{"prompt": "caf\xe9", "answer": "1"}', r"rows.jsonl:3: not valid UTF-8 \(byte b'\\xe9' at column 16\)"),
        (b"[1, 2]", r"rows.jsonl:3: a row must be a JSON object, not list"),
        (b'"just a string"', r"rows.jsonl:3: a row must be a JSON object, not str"),
    ],
    ids=["bad-json", "bad-utf8", "list", "string"],
)
def test_a_bad_line_is_named_with_its_file_and_number(tmp_path: Path, line: bytes, message: str) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(GOOD.encode() + b"\n\n" + line + b"\n" + GOOD.encode() + b"\n")  # a blank line 2 is skipped
    with pytest.raises(DatasetError, match=message):
        list(iter_jsonl(path))
    gz = tmp_path / "rows.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    with pytest.raises(DatasetError, match=message.replace("rows.jsonl", "rows.jsonl.gz")):
        list(iter_jsonl(gz))
    alone = tmp_path / "alone.jsonl"  # the loaders of the real datasets say the same
    alone.write_bytes(b"\n\n" + line + b"\n")
    for load in (load_gsm8k, load_humaneval):
        with pytest.raises(DatasetError, match=message.replace("rows.jsonl", "alone.jsonl")):
            load(alone)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "x"}, "rows.jsonl:2: each row needs `prompt` and `answer`"),
        ({"prompt": 7, "answer": "1"}, "rows.jsonl:2: `prompt` must be a non-empty string, not 7"),
        ({"prompt": "  ", "answer": "1"}, "rows.jsonl:2: `prompt` must be a non-empty string"),
        ({"prompt": "x", "answer": None}, "rows.jsonl:2: `answer` must be a string or a number, not NoneType"),
        ({"prompt": "x", "answer": [1]}, "rows.jsonl:2: `answer` must be a string or a number, not list"),
        ({"prompt": "x", "answer": "1", "id": {"a": 1}}, "rows.jsonl:2: `id` must be a string or an integer, not dict"),
        ({"prompt": "x", "answer": "1", "id": "row-1"}, "rows.jsonl:2: id 'row-1' repeats the one of line 1"),
    ],
    ids=["no-answer", "prompt-int", "prompt-blank", "answer-null", "answer-list", "id-dict", "id-repeated"],
)
def test_jsonl_task_rows_are_checked(tiny_policy_dir: Path, tmp_path: Path, row: dict, message: str) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(GOOD + "\n" + json.dumps(row) + "\n" + GOOD.replace("1+1", "2+2") + "\n")
    with pytest.raises(DatasetError, match=message.replace("(", r"\(").replace("[", r"\[")):
        build_task(TaskConfig(name="jsonl", path=str(path), eval_size=1), load_tokenizer(tiny_policy_dir))


def test_numbers_as_answers_and_ids_are_fine(tiny_policy_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"{i}+1", "answer": i + 1, "id": i}) for i in range(4)) + "\n")
    train, held, _ = build_task(TaskConfig(name="jsonl", path=str(path), eval_size=1), load_tokenizer(tiny_policy_dir))
    assert sorted(p.prompt_id for p in train + held) == ["0", "1", "2", "3"]


def test_task_level_errors(tiny_policy_dir: Path, tmp_path: Path) -> None:
    tok = load_tokenizer(tiny_policy_dir)
    path = tmp_path / "rows.jsonl"
    path.write_text(GOOD + "\n")
    with pytest.raises(DatasetError, match="task jsonl: 1 rows leave none for training after eval_size=1"):
        build_task(TaskConfig(name="jsonl", path=str(path), eval_size=1), tok)
    with pytest.raises(ConfigError, match="task.name=jsonl needs task.path"):
        build_task(TaskConfig(name="jsonl", eval_size=1), tok)
    with pytest.raises(FileNotFoundError):
        build_task(TaskConfig(name="jsonl", path=str(tmp_path / "missing.jsonl"), eval_size=1), tok)
    long = [Prompt("a", tuple(range(10)), "1"), Prompt("b", tuple(range(12)), "1")]
    with pytest.raises(DatasetError, match="every one of the 2 prompts is longer than rollout.max_prompt_len=8"):
        drop_long_prompts(long, 8)


def test_prompts_longer_than_the_engine_allows_are_dropped_and_counted(capsys: pytest.CaptureFixture[str]) -> None:
    prompts = [Prompt("a", tuple(range(10)), "1"), Prompt("b", tuple(range(12)), "1"), Prompt("c", (1, 2), "1")]
    kept = drop_long_prompts(prompts, 10, "training prompts")
    assert [p.prompt_id for p in kept] == ["a", "c"]
    out = capsys.readouterr().out
    assert out == "warning: dropped 1 of 3 training prompts longer than rollout.max_prompt_len=10 tokens\n"
