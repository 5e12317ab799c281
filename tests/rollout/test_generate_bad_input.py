"""``asyncrl generate`` on bad input (issue 14 item 6): invalid UTF-8, token ids outside the
vocabulary and prompts longer than the model's context are refused before anything is generated,
with one line naming the file and line (or the rows). And ``LocalEngine`` refuses a prompt that
leaves no room in its KV cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncrl import cli
from asyncrl.rollout.batch_generate import InputRowsError, generate_batch


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (b'{"prompt": "caf\xe9"}', r"in.jsonl:2: not valid UTF-8 (byte b'\xe9' at column 16)"),
        (json.dumps({"input_ids": [1, 99999]}).encode(), "rows [2] hold token ids outside the vocabulary [0, "),
        (json.dumps({"input_ids": [-1]}).encode(), "rows [2] hold token ids outside the vocabulary [0, "),
        (json.dumps({"input_ids": [5] * 2000}).encode(), "rows 2 (2000 tokens) fill the model's context"),
    ],
    ids=["bad-utf8", "id-over-vocab", "negative-id", "over-long"],
)
def test_refused_before_generating(tiny_dir: Path, tmp_path: Path, capsys: Any, row: bytes, message: str) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_bytes(json.dumps({"prompt": "Q:1=?\nA:"}).encode() + b"\n" + row + b"\n")
    with pytest.raises(InputRowsError) as info:
        generate_batch(str(tiny_dir), str(inp), str(out), max_new_tokens=4, max_slots=4)
    assert message in str(info.value)
    argv = ["generate", "--model", str(tiny_dir), "--input", str(inp), "--output", str(out), "--max-new-tokens", "4"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("asyncrl: ") and message in err and "Traceback" not in err
    assert not out.exists()


def test_the_engine_refuses_a_prompt_that_leaves_no_room(load_tiny: Any, arun: Any) -> None:
    from asyncrl.rollout.engine import LocalEngine
    from asyncrl.rollout.sampling import SamplingParams

    model, tok = load_tiny()
    engine = LocalEngine(model, tok, max_slots=2, max_seq_len=128)
    try:
        with pytest.raises(ValueError, match="prompt has 128 tokens; max_seq_len=128 leaves no room"):
            arun(engine.generate([5] * 128, SamplingParams(max_new_tokens=4)))
    finally:
        engine.close()
