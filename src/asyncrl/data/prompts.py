"""Prompt rendering and the prompt source of a run.

- ``render_prompt``: a question -> prompt token ids through the tokenizer's chat template (the
  tiny tokenizer brings a minimal one; real models bring theirs); never re-tokenised later.
- ``PromptSource``: an endless, seeded stream of ``Prompt``s over a split, epoch after epoch,
  with a position (``state_dict``) so a resumed run continues where it stopped.
- ``build_task``: the train and held-out prompt lists of the configured task (``calculator``: the
  multi-turn tool task's problems, ``data.calculator``; its episodes open with the environment's
  messages, ``rollout.workflow=agent``); a bad row of a
  dataset file raises ``data.rows.DatasetError`` naming the file and the line (``jsonl`` rows: a
  non-empty string ``prompt``, a string or number ``answer``, a unique ``id`` if any).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from asyncrl.config import ConfigError, SFTConfig, TaskConfig
from asyncrl.data.rows import DatasetError, bad_row, iter_jsonl
from asyncrl.data.synthetic import make_splits, teacher_solution
from asyncrl.types import KIND_KEY, Prompt


def render_prompt(tokenizer: Any, question: str) -> tuple[int, ...]:
    """Token ids of a one-turn user prompt ready for generation."""
    messages = [{"role": "user", "content": question}]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:
        text = f"Question: {question}\nAnswer:"
    return tuple(tokenizer.encode(text, add_special_tokens=False))


def build_task(
    task: TaskConfig, tokenizer: Any, *, teacher_slip_rate: float = SFTConfig.teacher_slip_rate
) -> tuple[list[Prompt], list[Prompt], list[tuple[str, str]]]:
    """``(train_prompts, held_out_prompts, demonstrations)`` for the configured task.

    Demonstrations are (question, worked solution) pairs for the warm start (empty where the
    task has none); for the synthetic task they come from a teacher that slips on the final
    answer at ``teacher_slip_rate`` (seeded by the task seed; default ``sft.teacher_slip_rate``'s)."""
    match task.name:
        case "arithmetic":
            train, held_out = make_splits(
                task.seed,
                task.train_size,
                task.eval_size,
                max_terms=task.max_terms,
                tail=task.length_tail,
                max_operand=task.max_operand,
                form=task.form,
            )

            def to_prompt(p: Any) -> Prompt:
                return Prompt(
                    prompt_id=p.problem_id,
                    token_ids=render_prompt(tokenizer, p.question),
                    answer=p.answer,
                    meta={"question": p.question, "num_terms": p.num_terms},
                )

            teacher_rng = random.Random(f"{task.seed}-teacher")
            demos = [(p.question, teacher_solution(p, teacher_rng, teacher_slip_rate)) for p in train]
            return [to_prompt(p) for p in train], [to_prompt(p) for p in held_out], demos
        case "calculator":
            from asyncrl.data.calculator import make_calculator_splits, problem_kind

            train_c, held_c = make_calculator_splits(
                task.seed, task.train_size, task.eval_size, task.calculator_max_digits
            )

            def calc_prompt(p: Any) -> Prompt:
                # the episode's opening is the environment's (system, tools, question); these ids measure it;
                # the kind: held-out accuracy is reported by it (controller.evaluate)
                meta = {"question": p.question, KIND_KEY: problem_kind(p.question)}
                return Prompt(p.problem_id, render_prompt(tokenizer, p.question), p.answer, meta)

            return [calc_prompt(p) for p in train_c], [calc_prompt(p) for p in held_c], []
        case "gsm8k" | "humaneval" | "jsonl":
            rows, prompt_key, reference_key = _load_rows(task)
            rng = random.Random(task.seed)
            rng.shuffle(rows)
            held, rest = rows[: task.eval_size], rows[task.eval_size :][: task.train_size]
            if not rest:
                raise DatasetError(
                    f"task {task.name}: {len(rows)} rows leave none for training after eval_size={task.eval_size}"
                )

            def row_prompt(row: dict[str, Any]) -> Prompt:
                return Prompt(
                    prompt_id=str(row["id"]),
                    token_ids=render_prompt(tokenizer, str(row[prompt_key])),
                    answer=str(row[reference_key]),
                    meta={**row, "question": str(row[prompt_key])},
                )

            return [row_prompt(r) for r in rest], [row_prompt(r) for r in held], []
        case other:
            raise ValueError(f"task.name={other!r} is not supported (arithmetic, calculator, gsm8k, humaneval, jsonl)")


def _load_rows(task: TaskConfig) -> tuple[list[dict[str, Any]], str, str]:
    """Rows of a real dataset and the names of their prompt and reference fields."""
    match task.name:
        case "gsm8k":
            from asyncrl.data.gsm8k import GSM8K_TASK, load_gsm8k

            return load_gsm8k(task.path), GSM8K_TASK["prompt_key"], GSM8K_TASK["reference_key"]
        case "humaneval":
            from asyncrl.data.humaneval import HUMANEVAL_TASK, load_humaneval

            return load_humaneval(task.path), HUMANEVAL_TASK["prompt_key"], HUMANEVAL_TASK["reference_key"]
        case "jsonl":
            if not task.path:
                raise ConfigError("task.name=jsonl needs task.path: a JSONL file with `prompt` and `answer` fields")
            return _jsonl_rows(task.path), "prompt", "answer"
        case other:
            raise ValueError(f"task.name={other!r} has no dataset loader")


def _jsonl_rows(path: str) -> list[dict[str, Any]]:
    """Rows of a ``task.name=jsonl`` file: ``prompt`` (a non-empty string), ``answer`` (a string or a
    number), optional ``id`` (a string or an integer, unique; default ``row-<line>``)."""
    rows: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for line_no, row in iter_jsonl(path):
        if "prompt" not in row or "answer" not in row:
            raise bad_row(path, line_no, "each row needs `prompt` and `answer`")
        if not isinstance(row["prompt"], str) or not row["prompt"].strip():
            raise bad_row(path, line_no, f"`prompt` must be a non-empty string, not {row['prompt']!r:.60}")
        answer = row["answer"]
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            raise bad_row(path, line_no, f"`answer` must be a string or a number, not {type(answer).__name__}")
        row.setdefault("id", f"row-{line_no}")
        if isinstance(row["id"], bool) or not isinstance(row["id"], (str, int)):
            raise bad_row(path, line_no, f"`id` must be a string or an integer, not {type(row['id']).__name__}")
        key = str(row["id"])
        if key in seen:
            raise bad_row(path, line_no, f"id {key!r} repeats the one of line {seen[key]} (ids key the ledger)")
        seen[key] = line_no
        rows.append(row)
    return rows


def drop_long_prompts(prompts: Sequence[Prompt], max_len: int, what: str = "prompts") -> list[Prompt]:
    """The prompts of at most ``max_len`` tokens; says how many were dropped (never silently)."""
    kept = [p for p in prompts if len(p.token_ids) <= max_len]
    if len(kept) < len(prompts):
        print(
            f"warning: dropped {len(prompts) - len(kept)} of {len(prompts)} {what} longer than "
            f"rollout.max_prompt_len={max_len} tokens"
        )
    if prompts and not kept:
        raise DatasetError(f"every one of the {len(prompts)} {what} is longer than rollout.max_prompt_len={max_len}")
    return kept


class PromptSource:
    """Endless seeded stream over ``prompts``: each epoch is a fresh shuffle."""

    def __init__(self, prompts: Sequence[Prompt], seed: int = 0) -> None:
        if not prompts:
            raise ValueError("PromptSource needs at least one prompt")
        self._prompts = list(prompts)
        self._seed = seed
        self.position = 0
        """How many prompts have been handed out (the data position saved in checkpoints)."""
        self._order: list[int] = []
        self._epoch = -1

    def _order_for(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            order = list(range(len(self._prompts)))
            random.Random(f"{self._seed}-{epoch}").shuffle(order)
            self._order, self._epoch = order, epoch
        return self._order

    def next(self) -> Prompt:
        epoch, index = divmod(self.position, len(self._prompts))
        prompt = self._prompts[self._order_for(epoch)[index]]
        self.position += 1
        if epoch > 0:  # ids stay unique across epochs
            prompt = Prompt(f"{prompt.prompt_id}@{epoch}", prompt.token_ids, prompt.answer, prompt.meta)
        return prompt

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])
