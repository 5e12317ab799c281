"""asyncrl generate (generate_batch): JSONL in, JSONL out, per-row budgets, n samples, validation."""

from __future__ import annotations

import json

import pytest

from asyncrl.rollout.batch_generate import generate_batch


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rows_in_order_with_budgets_and_fields(tiny_dir, tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(
        inp,
        [
            {"id": "a", "prompt": "Q:1+1=?\nA:", "max_new_tokens": 3},
            {"input_ids": [10, 11, 12]},
            {"id": 7, "prompt": "Q:2*3=?\nA:", "max_new_tokens": 1},
        ],
    )
    summary = generate_batch(str(tiny_dir), str(inp), str(out), max_new_tokens=6, greedy=True, max_slots=8)
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == ["a", 2, 7] and summary["rows"] == 3
    for r, budget in zip(rows, [3, 6, 1], strict=True):
        assert set(r) == {"id", "sample_idx", "output_ids", "text", "logprobs", "versions", "finish_reason"}
        assert len(r["output_ids"]) == len(r["logprobs"]) == len(r["versions"])
        assert r["finish_reason"] in ("stop", "length")
        assert len(r["output_ids"]) <= budget
        if r["finish_reason"] == "length":
            assert len(r["output_ids"]) == budget
    # Greedy is deterministic: a second run writes the same outputs.
    generate_batch(str(tiny_dir), str(inp), str(tmp_path / "again.jsonl"), max_new_tokens=6, greedy=True, max_slots=8)
    assert [r["output_ids"] for r in read_jsonl(tmp_path / "again.jsonl")] == [r["output_ids"] for r in rows]


def test_n_samples_per_row(tiny_dir, tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(inp, [{"prompt": "Q:9-3=?\nA:"}, {"prompt": "Q:4=?\nA:"}])
    summary = generate_batch(str(tiny_dir), str(inp), str(out), max_new_tokens=8, n=3, seed=0, max_slots=8)
    rows = read_jsonl(out)
    assert summary["samples"] == 6 and [(r["id"], r["sample_idx"]) for r in rows] == [
        (1, 0),
        (1, 1),
        (1, 2),
        (2, 0),
        (2, 1),
        (2, 2),
    ]


@pytest.mark.parametrize(
    "bad",
    [
        "{oops",
        json.dumps([1, 2]),
        json.dumps({"prompt": "x", "input_ids": [1]}),
        json.dumps({"input_ids": ["a"]}),
        json.dumps({"prompt": "Q:", "max_new_tokens": 0}),
        json.dumps({"text": "wrong key"}),
    ],
)
def test_malformed_rows_raise_with_line_number(tiny_dir, tmp_path, bad):
    inp = tmp_path / "in.jsonl"
    write_jsonl(inp, [{"prompt": "Q:1=?\nA:"}, bad])
    with pytest.raises(ValueError, match=r"in\.jsonl:2"):
        generate_batch(str(tiny_dir), str(inp), str(tmp_path / "out.jsonl"), max_new_tokens=8, max_slots=8)
