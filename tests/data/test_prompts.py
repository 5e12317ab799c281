"""Prompt rendering, the prompt source and the real-dataset tasks of build_task."""

from __future__ import annotations

import json

import pytest

from asyncrl.config import TaskConfig
from asyncrl.data.gsm8k import default_data_dir
from asyncrl.data.prompts import PromptSource, build_task, render_prompt
from asyncrl.models import load_tokenizer

DATA = default_data_dir()


def test_render_uses_chat_template(tiny_policy_dir) -> None:
    tok = load_tokenizer(tiny_policy_dir)
    assert tok.decode(list(render_prompt(tok, "3+4"))) == "Q:3+4\nA:"


def test_prompt_source_is_seeded_endless_and_resumable(tiny_policy_dir) -> None:
    tok = load_tokenizer(tiny_policy_dir)
    train, _, _ = build_task(TaskConfig(train_size=5, eval_size=3), tok)
    a = PromptSource(train, seed=1)
    first = [a.next().prompt_id for _ in range(12)]
    assert len(set(first[:5])) == 5 and first[5].endswith("@1")  # epoch 2 ids stay unique
    b = PromptSource(train, seed=1)
    b.load_state_dict({"position": 7})
    assert [b.next().prompt_id for _ in range(5)] == first[7:12]


@pytest.mark.skipif(not (DATA / "gsm8k_test.jsonl").is_file(), reason=f"GSM8K not found under {DATA}")
def test_gsm8k_task(tiny_policy_dir) -> None:
    tok = load_tokenizer(tiny_policy_dir)
    train, held, demos = build_task(TaskConfig(name="gsm8k", eval_size=20, train_size=50), tok)
    assert len(held) == 20 and len(train) == 50 and demos == []
    assert not {p.prompt_id for p in train} & {p.prompt_id for p in held}
    assert all(p.answer.lstrip("-").replace(".", "").isdigit() for p in train)


@pytest.mark.skipif(not (DATA / "HumanEval.jsonl.gz").is_file(), reason=f"HumanEval not found under {DATA}")
def test_humaneval_task_carries_the_row_for_the_code_verifier(tiny_policy_dir) -> None:
    tok = load_tokenizer(tiny_policy_dir)
    train, held, _ = build_task(TaskConfig(name="humaneval", eval_size=14, train_size=1000), tok)
    assert len(train) + len(held) == 164
    assert all("entry_point" in p.meta and "check(" in p.answer for p in held)


def test_jsonl_task_and_its_errors(tiny_policy_dir, tmp_path) -> None:
    tok = load_tokenizer(tiny_policy_dir)
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"{i}+1", "answer": str(i + 1)}) for i in range(6)) + "\n")
    train, held, _ = build_task(TaskConfig(name="jsonl", path=str(path), eval_size=2), tok)
    assert len(train) == 4 and len(held) == 2
    with pytest.raises(ValueError, match="needs task.path"):
        build_task(TaskConfig(name="jsonl", eval_size=2), tok)
    path.write_text(json.dumps({"prompt": "x"}) + "\n")
    with pytest.raises(ValueError, match="needs `prompt` and `answer`"):
        build_task(TaskConfig(name="jsonl", path=str(path), eval_size=1), tok)
