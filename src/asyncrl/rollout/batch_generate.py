"""``asyncrl generate``: batch generation from a JSONL file with ``LocalEngine``.

Owns the file-to-file path. Input rows hold ``prompt`` (text, tokenised as is: render chat
templates upstream) or ``input_ids``, optionally ``id`` (default: the row's line number) and a
per-row ``max_new_tokens``. Every row is submitted at once and continuous batching does the rest.
Output rows (input order, samples of one row together) hold ``id``, ``sample_idx``, ``output_ids``,
``text``, ``logprobs`` (behaviour log-probs: log softmax(logits / T) before truncation),
``versions`` and ``finish_reason``. Generation stops at the tokenizer's EOS ids. A bad input row
(not UTF-8, not JSON, wrong fields, token ids outside the vocabulary, a prompt that fills the model's
context) raises ``InputRowsError`` naming the file and line (or the rows) before anything is generated.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

__all__ = ["InputRowsError", "generate_batch", "read_rows"]


class InputRowsError(ValueError):
    """An input file of ``asyncrl generate`` that cannot be used; the message names the file and line."""


def _parse_line(raw: bytes, where: str) -> dict[str, Any] | None:
    """One JSONL line as a JSON object (None: a blank line)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = raw[e.start : e.start + 1]
        raise InputRowsError(f"{where}: not valid UTF-8 (byte {bad!r} at column {e.start + 1})") from None
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise InputRowsError(f"{where}: not valid JSON ({e.msg} at column {e.pos + 1})") from None
    if not isinstance(row, dict):
        raise InputRowsError(f"{where}: each row must be a JSON object")
    return row


def read_rows(path: str | Path, tokenizer: Any) -> list[tuple[str, list[int], int | None]]:
    """Parse and validate the input JSONL: ``[(id, input_ids, max_new_tokens or None)]``."""
    rows = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            where = f"{path}:{lineno}"
            row = _parse_line(raw, where)
            if row is None:
                continue
            if ("prompt" in row) == ("input_ids" in row):
                raise InputRowsError(f"{where}: give exactly one of 'prompt' (text) or 'input_ids'")
            if "prompt" in row:
                if not isinstance(row["prompt"], str) or not row["prompt"]:
                    raise InputRowsError(f"{where}: 'prompt' must be a non-empty string")
                ids = list(tokenizer(row["prompt"])["input_ids"])
            else:
                ids = row["input_ids"]
                if not isinstance(ids, list) or not ids or not all(type(t) is int for t in ids):
                    raise InputRowsError(f"{where}: 'input_ids' must be a non-empty list of ints")
            budget = row.get("max_new_tokens")
            if budget is not None and (type(budget) is not int or budget < 1):
                raise InputRowsError(f"{where}: 'max_new_tokens' must be an int >= 1")
            rid = row.get("id", lineno)
            rows.append((str(rid) if not isinstance(rid, (int, str)) else rid, ids, budget))
    if not rows:
        raise InputRowsError(f"{path}: no input rows")
    return rows


def _check_fits(rows: list[tuple[str, list[int], int | None]], vocab: int, limit: int) -> None:
    """Every row's token ids inside the vocabulary and its prompt shorter than the model's context."""
    outside = [rid for rid, ids, _ in rows if min(ids) < 0 or max(ids) >= vocab]
    if outside:
        raise InputRowsError(f"rows {outside[:5]} hold token ids outside the vocabulary [0, {vocab})")
    too_long = [(rid, len(ids)) for rid, ids, _ in rows if len(ids) >= limit]
    if too_long:
        shown = ", ".join(f"{rid} ({n} tokens)" for rid, n in too_long[:5])
        raise InputRowsError(f"the prompts of rows {shown} fill the model's context ({limit} tokens): shorten them")


def generate_batch(
    model: str,
    input_path: str,
    output_path: str,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    greedy: bool = False,
    n: int = 1,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
    max_slots: int,
    device: str = "cpu",
) -> dict[str, Any]:
    """Generate for every row of ``input_path`` into ``output_path``; returns a summary dict."""
    from asyncrl.models import load_policy, stop_token_ids
    from asyncrl.rollout.engine import LocalEngine
    from asyncrl.rollout.sampling import SamplingParams

    policy, tokenizer = load_policy(model, device=device)
    rows = read_rows(input_path, tokenizer)
    limit = getattr(policy.config, "max_position_embeddings", None) or 4096
    _check_fits(rows, policy.get_output_embeddings().weight.shape[0], limit)
    max_seq_len = min(max(len(ids) + (b or max_new_tokens) for _, ids, b in rows), limit)
    stops = stop_token_ids(tokenizer, policy)
    engine = LocalEngine(policy, tokenizer, max_slots=max(max_slots, n), max_seq_len=max_seq_len, device=device)

    async def run() -> list[Any]:
        jobs = []
        for i, (_, ids, budget) in enumerate(rows):
            sp = SamplingParams(
                max_new_tokens=budget or max_new_tokens,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                greedy=greedy,
                stop_token_ids=stops,
                seed=None if seed is None else seed + i * n,
            )
            jobs.append(engine.generate(ids, sp, n))
        return await asyncio.gather(*jobs)

    t0 = time.perf_counter()
    try:
        results = asyncio.run(run())
    finally:
        engine.close()
    wall = time.perf_counter() - t0
    tokens = 0
    Path(output_path).parent.mkdir(parents=True, exist_ok=True)
    with open(output_path, "w", encoding="utf-8") as f:
        for (rid, _, _), group in zip(rows, results, strict=True):
            for k, c in enumerate(group):
                tokens += len(c.output_ids)
                out = {
                    "id": rid,
                    "sample_idx": k,
                    "output_ids": list(c.output_ids),
                    "text": tokenizer.decode(list(c.output_ids), skip_special_tokens=True),
                    "logprobs": list(c.behav_logprobs),
                    "versions": list(c.versions),
                    "finish_reason": c.finish_reason,
                }
                f.write(json.dumps(out) + "\n")
    summary = {
        "rows": len(rows),
        "samples": len(rows) * n,
        "generated_tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1) if wall > 0 else 0.0,
        "output": str(output_path),
    }
    return summary
