"""Bad model directories and bad datasets given to ``asyncrl train`` (issue 14 item 6): each stops
before the run directory is created, with one line naming the directory (or file and line) and what
is wrong (exit code 2, no traceback)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from asyncrl import cli
from asyncrl.models import ModelDirError, load_policy


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _no_tokenizer(tiny: Path, out: Path) -> Path:
    d = _copy(tiny, out)
    for f in d.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            f.unlink()
    return d


def _unknown_type(tiny: Path, out: Path) -> Path:
    d = _copy(tiny, out)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "model_type": "foo"}))
    return d


def _damaged_weights(tiny: Path, out: Path) -> Path:
    d = _copy(tiny, out)
    with open(d / "model.safetensors", "r+b") as fh:
        fh.truncate(1000)
    return d


def _no_weights(tiny: Path, out: Path) -> Path:
    d = _copy(tiny, out)
    (d / "model.safetensors").unlink()
    return d


def _gpt2(tiny: Path, out: Path) -> Path:
    """A causal LM transformers loads but the local engine cannot run (not Llama-family)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=100, n_positions=256)).save_pretrained(out)
    for f in tiny.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, out)
    return out


CASES = {
    "no-tokenizer": (_no_tokenizer, r"has no tokenizer \(none of tokenizer.json, .*tokenizer.save_pretrained"),
    "unknown-type": (_unknown_type, r"cannot be loaded as a causal language model \(ValueError: .*model type `foo`"),
    "damaged-weights": (_damaged_weights, r"cannot be loaded as a causal language model \(SafetensorError: "),
    "no-weights": (_no_weights, r"cannot be loaded as a causal language model \(OSError: .*no file named model"),
}


def _no_config(tiny: Path, out: Path) -> Path:
    d = _copy(tiny, out)
    (d / "config.json").unlink()
    return d


@pytest.mark.parametrize("case", sorted(CASES))
def test_load_policy_names_the_directory_and_the_problem(tiny_policy_dir: Path, tmp_path: Path, case: str) -> None:
    make, message = CASES[case]
    d = make(tiny_policy_dir, tmp_path / "model")
    with pytest.raises(ModelDirError, match=message) as info:
        load_policy(d)
    assert str(info.value).startswith(str(d))


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("no-config", "is not a Hugging Face model directory (no config.json). Pass --model DIR"),
        ("no-tokenizer", "has no tokenizer (none of tokenizer.json"),
        ("unknown-type", "cannot be loaded as a causal language model (ValueError: "),
        ("gpt2", "LocalEngine runs Llama-family decoders ('llama', 'mistral', 'qwen2', 'qwen3'); got model_type='gpt2"),
        ("bad-dataset", "rows.jsonl:2: not valid JSON (Expecting ',' delimiter at column 31)"),
    ],
)
def test_train_stops_before_the_run_directory_with_one_line(
    tiny_policy_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, message: str
) -> None:
    sets = ["controller.total_steps=1", "controller.trainer_process=false", "run.progress=false"]
    model = tiny_policy_dir
    if case == "gpt2":
        model = _gpt2(tiny_policy_dir, tmp_path / "model")
    elif case == "no-config":
        model = _no_config(tiny_policy_dir, tmp_path / "model")
    elif case != "bad-dataset":
        model = CASES[case][0](tiny_policy_dir, tmp_path / "model")
    else:
        rows = tmp_path / "rows.jsonl"
        rows.write_text('{"prompt": "1+1", "answer": "2"}\n{"prompt": "2+2", "answer": 4\n')
        sets += ["task.name=jsonl", f"task.path={rows}"]
    run_dir = tmp_path / "run"
    argv = ["train", "--model", str(model), "--run-dir", str(run_dir)] + [a for s in sets for a in ("--set", s)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("asyncrl: ") and message in err and "Traceback" not in err and err.count("\n") == 1
    assert not run_dir.exists()  # nothing was written
