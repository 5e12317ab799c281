"""verifiers tasksets as a task: ``task.name=verifiers task.datasets=<taskset id>``.

Owns the prompts of a verifiers (0.4) ``vf.Taskset``: its tasks, loaded through verifiers' own loader
(``verifiers.v1.utils.loaders``: an installed module exporting one ``Taskset`` subclass in ``__all__``), are
shuffled with ``task.seed``; the first ``eval_size`` are held out and the next ``train_size`` train (an
endless taskset is read ``eval_size + train_size`` tasks deep first). Each ``Prompt`` carries the taskset id
and the task's wire data in ``meta["verifiers"]`` (the environment ``agent.env=verifiers`` rebuilds the task
from it and scores with the task's own rewards), its text prompt as ``meta["question"]`` and, when the task's
data has an ``answer`` field, that as the reference. The prompt id is the task's ``id`` when its data has
one, else its content key (``Task.key``); the task's ``name``, when set, is its problem kind.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from asyncrl.config import ConfigError
from asyncrl.types import KIND_KEY, Prompt

__all__ = ["META_KEY", "verifiers_prompts"]

META_KEY = "verifiers"
"""The ``Prompt.meta`` key the environment reads (``rollout.envs.verifiers.META_KEY``)."""


def _tasks(taskset_id: str, count: int, seed: int) -> list[Any]:
    from verifiers.v1.utils.loaders import load_taskset, taskset_config_type

    try:
        taskset = load_taskset(taskset_config_type(taskset_id)(id=taskset_id))
    except (ImportError, AttributeError, TypeError, ValueError) as e:
        raise ConfigError(
            f"task.datasets={taskset_id}: not a verifiers taskset ({type(e).__name__}: {str(e).splitlines()[0]})"
        ) from None
    if not taskset.bounded:
        taskset = taskset.take(count)
    tasks = list(taskset)
    random.Random(seed).shuffle(tasks)
    return tasks


def _prompt(taskset_id: str, task: Any, render: Callable[[str], tuple[int, ...]]) -> Prompt:
    data = task.data
    question = data.prompt_text
    meta: dict[str, Any] = {
        "question": question,
        META_KEY: {"taskset": taskset_id, "task": data.model_dump(mode="json", exclude_none=True)},
    }
    if data.name:
        meta[KIND_KEY] = str(data.name)
    answer = getattr(data, "answer", "")
    return Prompt(str(data.id or task.key[:16]), render(question), "" if answer is None else str(answer), meta)


def verifiers_prompts(
    taskset_id: str, seed: int, train_size: int, eval_size: int, render: Callable[[str], tuple[int, ...]]
) -> tuple[list[Prompt], list[Prompt]]:
    """``(train, held_out)`` prompts of the verifiers taskset ``taskset_id`` (see the module docstring)."""
    tasks = _tasks(taskset_id, train_size + eval_size, seed)
    held, rest = tasks[:eval_size], tasks[eval_size:][:train_size]
    if not rest:
        raise ConfigError(
            f"task.datasets={taskset_id}: {len(tasks)} tasks leave none for training after eval_size={eval_size}"
        )
    keys = {t.key for t in held}
    train = [_prompt(taskset_id, t, render) for t in rest if t.key not in keys]
    return train, [_prompt(taskset_id, t, render) for t in held]
