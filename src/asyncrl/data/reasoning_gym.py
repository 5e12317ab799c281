"""reasoning-gym datasets as a task (``task.name=reasoning_gym``): procedurally generated problems, scored
by the dataset's own ``score_answer`` (``task.verifier=reasoning_gym``, ``reward.reasoning_gym``).

Owns the loading: ``task.datasets`` names one reasoning-gym dataset or several (comma-separated, drawn with
equal weights through reasoning-gym's ``composite`` dataset), each at its default configuration or with
reasoning-gym's own config options after its name (``chain_sum:max_terms=3:max_digits=2``, that is
``name(:key=value)*``, values read as JSON, else as text; ``dataset_specs``); one dataset of ``task.eval_size
+ task.train_size`` entries is generated with ``task.seed``; the first ``eval_size`` are held out and training
keeps the rest whose question is not among them (procedural generators repeat themselves now and then). Each
entry becomes a ``Prompt``: the question rendered as a user turn, the dataset's answer as the reference, its
source dataset as the problem kind (held-out accuracy by dataset), and the whole entry (question, answer,
metadata) under :data:`ENTRY_KEY` for the verifier, which needs it to score.

Also owns ``calculator_expression``: the arithmetic expression that computes an entry's answer, built from
the entry's own metadata (the ``expression`` the generator recorded; ``leg_counting``: each animal's count
times its legs from reasoning-gym's own table), for worked calculator conversations of the warm start; and
``worked_solution``: that expression worked out one operation at a time (``3*4=12 12+7=19``, each product,
then the running sum) and the answer in reasoning-gym's ``<answer>...</answer>``, the single-turn warm start's
demonstration (the answer alone where the entry records no expression of that form).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from asyncrl.types import KIND_KEY, Prompt

__all__ = [
    "ENTRY_KEY",
    "calculator_expression",
    "dataset_names",
    "dataset_specs",
    "load_entries",
    "reasoning_gym_prompts",
    "worked_solution",
]

ENTRY_KEY = "reasoning_gym_entry"
"""The ``Prompt.meta`` key of the reasoning-gym entry (``question``, ``answer``, ``metadata``)."""


def dataset_specs(spec: str) -> list[tuple[str, dict[str, Any]]]:
    """``(name, config options)`` of each dataset of ``task.datasets`` (see the module docstring); ValueError
    (one line) for an unknown name or an option without ``=``."""
    out: list[tuple[str, dict[str, Any]]] = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, *options = (piece.strip() for piece in item.split(":"))
        config: dict[str, Any] = {}
        for option in options:
            key, eq, value = option.partition("=")
            if not eq or not key.strip():
                raise ValueError(f"task.datasets={spec!r}: {option!r} is not key=value (e.g. chain_sum:max_terms=3)")
            config[key.strip()] = _option_value(value.strip())
        out.append((name, config))
    dataset_names(",".join(name for name, _ in out) if out else "")
    return out


def _option_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def dataset_names(spec: str) -> list[str]:
    """The dataset names of ``task.datasets`` (comma-separated; options after a name's ``:`` are not part of
    it); ValueError (one line) for an unknown one."""
    import reasoning_gym

    names = [n.split(":")[0].strip() for n in spec.split(",") if n.strip()]
    known = reasoning_gym.factory.DATASETS
    unknown = [n for n in names if n not in known or n == "composite"]
    if unknown or not names:
        raise ValueError(
            f"task.datasets={spec!r}: {', '.join(unknown) or 'no name'} is not a reasoning-gym dataset "
            f"(reasoning-gym has: {', '.join(sorted(n for n in known if n != 'composite'))})"
        )
    return names


def load_entries(spec: str, seed: int, size: int) -> list[dict[str, Any]]:
    """``size`` entries of the dataset(s) ``spec`` generated with ``seed``; ValueError (one line) for options
    the dataset's config refuses."""
    import reasoning_gym
    from reasoning_gym.composite import DatasetSpec

    specs = dataset_specs(spec)
    try:
        if len(specs) == 1:
            dataset = reasoning_gym.create_dataset(specs[0][0], seed=seed, size=size, **specs[0][1])
        else:
            weighted = [DatasetSpec(name=n, weight=1.0, config=c) for n, c in specs]
            dataset = reasoning_gym.create_dataset("composite", seed=seed, size=size, datasets=weighted)
    except (TypeError, AssertionError) as e:
        raise ValueError(f"task.datasets={spec!r}: reasoning-gym refused the options: {e}") from None
    return [dataset[i] for i in range(size)]


def calculator_expression(entry: dict[str, Any]) -> str | None:
    """The expression whose value is ``entry``'s answer (see the module docstring), or None where the
    entry's metadata records none."""
    metadata = entry.get("metadata") or {}
    if isinstance(metadata.get("expression"), str):
        return "".join(metadata["expression"].split())
    animals = metadata.get("animals")
    if metadata.get("source_dataset") == "leg_counting" and isinstance(animals, dict):
        from reasoning_gym.arithmetic.leg_counting import ANIMALS

        return "+".join(f"{count}*{ANIMALS[animal]}" for animal, count in animals.items())
    return None


_TERM = r"-?\d+(?:\*\d+)?"
_SUM_OF_PRODUCTS = re.compile(rf"({_TERM})((?:[+-]{_TERM})*)")


def worked_solution(entry: dict[str, Any]) -> str:
    """``entry``'s answer worked out step by step (see the module docstring)."""
    answer = f"<answer>{entry['answer']}</answer>"
    expression = calculator_expression(entry)
    found = _SUM_OF_PRODUCTS.fullmatch(expression or "")
    if found is None:
        return answer
    steps: list[str] = []

    def value(term: str) -> int:
        if "*" not in term:
            return int(term)
        a, b = term.split("*")
        steps.append(f"{term}={int(a) * int(b)}")
        return int(a) * int(b)

    total = value(found.group(1))
    rest = [(m.group(1), value(m.group(2))) for m in re.finditer(rf"([+-])({_TERM})", found.group(2))]
    for op, term in rest:
        new = total + term if op == "+" else total - term
        steps.append(f"{total}{op}{term}={new}")
        total = new
    if str(total) != str(entry["answer"]).strip():
        return answer
    return " ".join([*steps, answer])


def reasoning_gym_prompts(
    spec: str, seed: int, train_size: int, eval_size: int, render: Callable[[str], tuple[int, ...]]
) -> tuple[list[Prompt], list[Prompt]]:
    """(train, held-out) prompts of ``task.datasets=spec`` (see the module docstring); ``render``: a
    question -> prompt token ids."""
    entries = load_entries(spec, seed, eval_size + train_size)
    held, rest = entries[:eval_size], entries[eval_size:]
    held_questions = {e["question"] for e in held}
    train = [e for e in rest if e["question"] not in held_questions]

    def prompt(entry: dict[str, Any], index: int, split: str) -> Prompt:
        source = str(entry["metadata"].get("source_dataset", spec))
        meta = {"question": entry["question"], KIND_KEY: source, ENTRY_KEY: entry}
        return Prompt(f"rg-{split}-{index}", render(entry["question"]), str(entry["answer"]), meta)

    return [prompt(e, i, "train") for i, e in enumerate(train)], [prompt(e, i, "eval") for i, e in enumerate(held)]
