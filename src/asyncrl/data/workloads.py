"""The named training workloads: ``task``, ``long`` and ``reason``, as config overrides.

Owns ``WORKLOADS`` (the ``--set`` overrides that make each workload out of the default config),
``WARM_STARTS`` (the overrides of each workload's warm start, built once and cached under
``sft.cache_dir``) and ``WORKLOAD_ALIASES``. The planner reads them (``sim.plan_workloads``: what a
workload's real run looks like to the simulator) and so do the benchmarks that train them
(``benchmarks/async_bench.py``, ``headline``, ``adaptive``, ``plan-check``). Data only: no function,
no import of the project.

- ``task``: the default task as configured (trainer-bound on 2 CPU cores);
- ``long``: generation-bound, long-tailed responses (problems of up to 256 operands, up to 2048 new
  tokens, B = 8), every generated group trained, the high-water mark counted in samples and
  in-flight updates keeping the KV cache (``rollout.interrupt_mode=keep``);
- ``reason``: a repeat task whose worked solutions run to hundreds or thousands of tokens, the
  workload of the headline (time to a target accuracy).
"""

from __future__ import annotations

__all__ = ["LONG_TASK", "REASON_TASK", "WARM_STARTS", "WORKLOADS", "WORKLOAD_ALIASES"]

LONG_TASK = ["task.max_terms=256", "task.length_tail=0.98"]
REASON_TASK = ["task.form=repeat", "task.max_terms=300", "task.length_tail=0.986"]

WORKLOADS: dict[str, list[str]] = {
    "task": [],
    "long": [
        *LONG_TASK,
        "rollout.max_new_tokens=2048",
        "eval.max_new_tokens=2048",
        "controller.batch_size=8",
        "algo.filter_equal_rewards=false",
        "task.eval_size=64",
        "eval.samples_per_prompt=1",
        "eval.report_greedy=false",
        "rollout.interrupt_mode=keep",
        "controller.high_water_unit=samples",
    ],
    "reason": [
        *REASON_TASK,
        "rollout.max_new_tokens=2048",
        "eval.max_new_tokens=2048",
        "controller.batch_size=8",
        "trainer.lr=1.5e-4",
        "task.eval_size=64",
        "eval.samples_per_prompt=2",
        "eval.report_greedy=false",
        "rollout.interrupt_mode=keep",
        "controller.high_water_unit=samples",
    ],
}
"""Config overrides of each workload (a benchmark's ``--set`` wins over them: ``benchmarks.async_bench.
workload_overrides``)."""

WARM_STARTS: dict[str, list[str]] = {
    "task": [],
    "long": [*LONG_TASK, "sft.steps=150", "sft.batch_size=32"],
    "reason": [*REASON_TASK, "sft.steps=600", "sft.batch_size=32"],
}
"""Overrides of each workload's warm start (``ensure_policy``; built once, cached under
``sft.cache_dir``): ``long`` gets a policy fine-tuned on the long problems themselves, so that it
writes their long worked solutions (the default policy, tuned on up to 8 operands, gives up after
a few dozen steps)."""

WORKLOAD_ALIASES = {"a": "task", "b": "long"}
"""The names the workloads had first (``a``, ``b``), still accepted."""
