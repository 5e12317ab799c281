"""reasoning-gym datasets as a task (``task.name=reasoning_gym``): procedurally generated problems, scored
by the dataset's own ``score_answer`` (``task.verifier=reasoning_gym``, ``reward.reasoning_gym``).

Owns the loading: ``task.datasets`` names one reasoning-gym dataset or several (comma-separated, drawn with
equal weights through reasoning-gym's ``composite`` dataset), each at its default configuration; one
dataset of ``task.eval_size + task.train_size`` entries is generated with ``task.seed``; the first
``eval_size`` are held out and training keeps the rest whose question is not among them (procedural
generators repeat themselves now and then). Each entry becomes a ``Prompt``: the question rendered as a
user turn, the dataset's answer as the reference, its source dataset as the problem kind (held-out
accuracy by dataset), and the whole entry (question, answer, metadata) under :data:`ENTRY_KEY` for the
verifier, which needs it to score.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncrl.types import KIND_KEY, Prompt

__all__ = ["ENTRY_KEY", "dataset_names", "load_entries", "reasoning_gym_prompts"]

ENTRY_KEY = "reasoning_gym_entry"
"""The ``Prompt.meta`` key of the reasoning-gym entry (``question``, ``answer``, ``metadata``)."""


def dataset_names(spec: str) -> list[str]:
    """The dataset names of ``task.datasets`` (comma-separated); ValueError (one line) for an unknown one."""
    import reasoning_gym

    names = [n.strip() for n in spec.split(",") if n.strip()]
    known = reasoning_gym.factory.DATASETS
    unknown = [n for n in names if n not in known or n == "composite"]
    if unknown or not names:
        raise ValueError(
            f"task.datasets={spec!r}: {', '.join(unknown) or 'no name'} is not a reasoning-gym dataset "
            f"(reasoning-gym has: {', '.join(sorted(n for n in known if n != 'composite'))})"
        )
    return names


def load_entries(spec: str, seed: int, size: int) -> list[dict[str, Any]]:
    """``size`` entries of the dataset(s) ``spec`` generated with ``seed``."""
    import reasoning_gym
    from reasoning_gym.composite import DatasetSpec

    names = dataset_names(spec)
    if len(names) == 1:
        dataset = reasoning_gym.create_dataset(names[0], seed=seed, size=size)
    else:
        specs = [DatasetSpec(name=n, weight=1.0, config={}) for n in names]
        dataset = reasoning_gym.create_dataset("composite", seed=seed, size=size, datasets=specs)
    return [dataset[i] for i in range(size)]


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
