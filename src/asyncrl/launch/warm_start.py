"""The warm start: build the tiny default policy and fine-tune it on demonstrations, cached.

``ensure_policy(cfg)`` returns the model directory a run starts from: ``model.path`` when the
user gave one; otherwise ``<sft.cache_dir>/tiny-sft-<key>``, built (random-init tiny model +
``asyncrl sft`` on the task's demonstrations) the first time and reused afterwards. The key
hashes everything that changes the result (model shape, task, SFT settings; for ``calculator``
also the call format and environment), so a changed setting never reuses a stale cache. The
model's shape is the config's (``sft.hidden_size`` ..., ``models.tiny_spec``); the key hashes it
as the spec it always hashed, so a config at the default shape keeps its key. The directory is
written atomically (temp dir + rename).

Demonstrations (``warm_start_examples``): single-turn tasks give (question, worked solution) pairs,
the response learned; ``task.name=calculator`` (multi-turn, ``rollout.workflow=agent``) gives worked
conversations of its *training* problems (``data.calculator.demonstration``: the call in
``agent.tool_format``, the tool's result, the answer; or, on the problems that ``sft.tool_call_fraction``
leaves out, the answer at once with no call), opened by the environment's own ``reset`` and
built by ``rollout.chat.demonstration_ids`` exactly as an episode builds its sequence; the loss
covers the assistant turns only. Keep ``sft.steps`` short there: a partial warm start teaches the
format and leaves RL room to improve. ``sft.second_stage_steps`` > 0 continues the built policy on the
same problems with ``sft.second_stage_tool_call_fraction`` of them calling (``second_stage_config``): a
policy that can copy into the call but seldom makes one. ``sft.restart_check_step`` > 0 builds the policy
again and reruns the (first) stage with another seed when, at that step, its loss shows it has not taken
(``run_warm_start``).

``task.name=reasoning_gym`` (``reasoning_gym_examples``) demonstrates its *training* entries (never held-out
ones) as the task's own generator made them: single-turn, the question and its answer worked out step by step
(``data.reasoning_gym.worked_solution``); with
``rollout.workflow=agent agent.env=calculator``, the calculator's worked conversation, the call's expression
built from the entry's metadata (``data.reasoning_gym.calculator_expression``), the tool's result, ``#answer``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from asyncrl.config import Config, SFTConfig, with_values
from asyncrl.config.checks import SFT_RESTART_FIELDS
from asyncrl.data.prompts import build_task, render_prompt
from asyncrl.models import TINY_SHAPE_FIELDS, build_tiny_policy, load_policy, tiny_spec
from asyncrl.trainer.sft import SFTExample, prompt_response_example, sft_train
from asyncrl.types import Prompt

T = TypeVar("T")

CALCULATOR_DEMO_FORMAT = 1
"""Bump when the calculator demonstrations change (system message, tool schema, conversation)."""

REASONING_GYM_DEMO_FORMAT = 1
"""Bump when the reasoning-gym demonstrations change."""


_TASK_FIELDS_ADDED = {"calculator_max_digits": 0, "datasets": None}
"""TaskConfig fields added after caches were keyed, with their defaults: hashed only when set otherwise, so
that every existing config keeps its key (and its cached warm start)."""

_SFT_FIELDS_ADDED = {"tool_call_fraction": SFTConfig.tool_call_fraction, "stop_below_loss": 0.0}
"""The same for SFTConfig fields (the tiny model's shape enters through the spec instead)."""

_SECOND_STAGE_FIELDS = tuple(f.name for f in fields(SFTConfig) if f.name.startswith("second_stage_"))
"""The second stage's settings (``sft.second_stage_*``): hashed only when it runs (``sft.second_stage_steps`` > 0),
so a config without one keeps its key (``config.checks`` refuses the others set without it); the restart's
(``SFT_RESTART_FIELDS``) likewise, only when ``sft.restart_check_step`` > 0."""


RESTART_SEED_STRIDE = 1000
"""The k-th restart of the warm start runs with ``sft.seed`` + k x this: far from the seeds a sweep runs."""


def warm_start_key(cfg: Config) -> str:
    """The cache key of ``cfg``'s warm start (see the module docstring). The tiny model's shape
    (``sft.hidden_size`` ...) enters through the spec, never twice."""
    at_default = tuple(k for k, default in _TASK_FIELDS_ADDED.items() if getattr(cfg.task, k) == default)
    sft_left_out = (
        *TINY_SHAPE_FIELDS,
        *(k for k, default in _SFT_FIELDS_ADDED.items() if getattr(cfg.sft, k) == default),
        *(_SECOND_STAGE_FIELDS if not cfg.sft.second_stage_steps else ()),
        *(SFT_RESTART_FIELDS if not cfg.sft.restart_check_step else ()),
    )
    payload = {
        "spec": tiny_spec(cfg.sft).__dict__,
        "sft": {k: v for k, v in cfg.sft.__dict__.items() if k not in sft_left_out},
        "task": {k: v for k, v in cfg.task.__dict__.items() if k not in ("eval_size", *at_default)},
        "micro": cfg.trainer.max_tokens_per_micro_batch,
        "format": 3,  # 3: held-out and training split by question hash (data/synthetic.py)
    }
    if cfg.task.name == "calculator":  # only here, so the single-turn tasks' caches keep their keys
        payload["agent"] = {"tool_format": cfg.agent.tool_format, "env": cfg.agent.env}
        payload["calculator_demo_format"] = CALCULATOR_DEMO_FORMAT
    if cfg.task.name == "reasoning_gym":  # no earlier cache: reasoning-gym had no demonstrations
        payload["eval_size"] = cfg.task.eval_size  # training is what follows the held-out entries: never reuse
        agent = cfg.agent
        payload["agent"] = {"workflow": cfg.rollout.workflow, "tool_format": agent.tool_format, "env": agent.env}
        payload["reasoning_gym_demo_format"] = REASONING_GYM_DEMO_FORMAT
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def run_warm_start(cfg: Config, out_dir: str | Path) -> dict[str, float]:
    """Build the tiny policy (the shape of ``sft.*``) in ``out_dir`` and fine-tune it in place on the
    task's demonstrations, again from a fresh build (the same initial weights) with the next example order while
    ``sft.restart_check_step`` finds the loss above ``sft.restart_loss_above`` (``sft_restarts``, ``sft_seed``: the
    seed kept; ``sft_abandoned_steps`` / ``_wall_s``: what the abandoned attempts cost); then, with
    ``sft.second_stage_steps`` > 0, on the second stage's (its statistics prefixed ``second_stage_``)."""
    out = Path(out_dir)
    sft = cfg.sft
    restarts = sft.max_restarts if sft.restart_check_step else 0
    abandoned_steps, abandoned_s = 0, 0.0
    for attempt in range(restarts + 1):
        seed = sft.seed + RESTART_SEED_STRIDE * attempt
        cfg = with_values(cfg, {"sft.seed": seed})
        build_tiny_policy(out, tiny_spec(sft))
        check = (sft.restart_check_step, sft.restart_loss_above) if attempt < restarts else None
        stats = fine_tune_in_place(cfg, out, abandon_above=check)
        if "sft_abandoned_at" not in stats:
            break
        abandoned_steps += int(stats["sft_abandoned_at"])
        abandoned_s += stats["sft_wall_s"]
        print(
            f"warm start: loss {stats['sft_loss']:.3f} > {sft.restart_loss_above} at step {sft.restart_check_step} "
            f"with sft.seed={seed}: built again, sft.seed={seed + RESTART_SEED_STRIDE}",
            flush=True,
        )
    if sft.restart_check_step:
        stats = {
            **stats,
            "sft_restarts": float(attempt),
            "sft_seed": float(seed),
            "sft_abandoned_steps": float(abandoned_steps),
            "sft_abandoned_wall_s": abandoned_s,
        }
    if cfg.sft.second_stage_steps:
        second = fine_tune_in_place(second_stage_config(cfg), out)
        stats = {**stats, **{f"second_stage_{k}": v for k, v in second.items()}}
    (out / "warm_start.json").write_text(json.dumps(stats, indent=2))
    return stats


def second_stage_config(cfg: Config) -> Config:
    """``cfg`` with the second stage's settings in the first stage's fields (steps, lr, warm-up, the share of
    demonstrations that call the tool), for ``fine_tune_in_place``; the restart's and ``sft.stop_below_loss`` at
    their defaults (off: the second stage continues the first, runs its steps and is never started again)."""
    sft, defaults = cfg.sft, SFTConfig()
    return with_values(
        cfg,
        {
            "sft.steps": sft.second_stage_steps,
            "sft.lr": sft.second_stage_lr,
            "sft.warmup_steps": sft.second_stage_warmup_steps,
            "sft.tool_call_fraction": sft.second_stage_tool_call_fraction,
            "sft.stop_below_loss": defaults.stop_below_loss,
            **{f"sft.{k}": getattr(defaults, k) for k in SFT_RESTART_FIELDS},
        },
    )


def fine_tune_in_place(
    cfg: Config, policy_dir: str | Path, *, abandon_above: tuple[int, float] | None = None
) -> dict[str, float]:
    """Fine-tune the policy in ``policy_dir`` on the task's demonstrations (``sft.*``) and save it there
    (weights and tokenizer); the training statistics (``abandon_above``: ``sft_train``'s). Each stage of the warm
    start (the second through ``second_stage_config``), and what ``scripts/calculator_second_stage.py`` runs on a
    copy of an existing policy."""
    out = Path(policy_dir)
    model, tokenizer = load_policy(out, device=cfg.model.device)
    stats = sft_train(
        model,
        warm_start_examples(cfg, tokenizer),
        cfg.sft,
        device=cfg.model.device,
        max_tokens_per_micro_batch=cfg.trainer.max_tokens_per_micro_batch,
        progress=cfg.run.progress,
        abandon_above=abandon_above,
        stop_below=cfg.sft.stop_below_loss,
    )
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return stats


def warm_start_examples(cfg: Config, tokenizer: Any) -> list[SFTExample]:
    """The task's demonstrations as ``(ids, loss mask)`` (see the module docstring)."""
    if cfg.task.name == "calculator":
        return calculator_examples(cfg, tokenizer)
    if cfg.task.name == "reasoning_gym":
        return reasoning_gym_examples(cfg, tokenizer)
    _, _, demos = build_task(cfg.task, tokenizer, teacher_slip_rate=cfg.sft.teacher_slip_rate)
    if not demos:
        raise ValueError(f"task {cfg.task.name!r} has no demonstrations for a warm start; pass --model DIR")
    eos = (tokenizer.eos_token_id,)
    return [
        prompt_response_example(render_prompt(tokenizer, q), tuple(tokenizer.encode(a, add_special_tokens=False)) + eos)
        for q, a in demos
    ]


def _run_alone(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from synchronous code; when this thread already runs an event loop
    (``asyncrl train`` builds a missing warm start from inside its own), in a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def calculator_examples(cfg: Config, tokenizer: Any) -> list[SFTExample]:
    """Worked conversations of the calculator task's training problems (never its held-out ones), in
    ``agent.tool_format``, each opened by the calculator environment's ``reset``; turns end at EOS. A
    share ``sft.tool_call_fraction`` of them (by question hash) calls the tool, the rest answer directly."""
    from asyncrl.data.calculator import demonstrates_call, demonstration, make_calculator_splits
    from asyncrl.rollout.chat import ChatRenderer, demonstration_ids
    from asyncrl.rollout.envs.base import Message
    from asyncrl.rollout.envs.calculator import calculator_env, calculator_tool
    from asyncrl.rollout.tools import ToolCall, format_tool_call

    if cfg.agent.env != "calculator":
        raise ValueError(f"task.name=calculator warm-starts the calculator env, not agent.env={cfg.agent.env!r}")
    train, _ = make_calculator_splits(cfg.task.seed, cfg.task.train_size, 0, cfg.task.calculator_max_digits)
    renderer = ChatRenderer(tokenizer, (tokenizer.eos_token_id,))
    tool = calculator_tool()
    env = calculator_env()
    prompts = [Prompt(p.problem_id, (), p.answer, {"question": p.question}) for p in train]

    async def openings() -> list[Any]:
        return [await env.reset(prompt) for prompt in prompts]

    examples: list[SFTExample] = []
    for problem, opening in zip(train, _run_alone(openings), strict=True):
        call = format_tool_call(cfg.agent.tool_format, ToolCall(tool.name, {tool.arg: problem.question}), tool.tag)
        calls = demonstrates_call(problem.question, cfg.sft.tool_call_fraction)
        worked = demonstration(problem, env.tool_role, call, calls_tool=calls)[1:]  # reset opened with the question
        messages = [*opening.messages, *(Message(m["role"], m["content"]) for m in worked)]
        examples.append(demonstration_ids(renderer, messages, opening.tools))
    return examples


def reasoning_gym_examples(cfg: Config, tokenizer: Any) -> list[SFTExample]:
    """Demonstrations of the reasoning-gym task's training entries (see the module docstring); turns end at EOS."""
    from asyncrl.data.reasoning_gym import ENTRY_KEY, calculator_expression, worked_solution

    train, _, _ = build_task(cfg.task, tokenizer)
    eos = (tokenizer.eos_token_id,)
    if cfg.rollout.workflow != "agent":
        solutions = [tokenizer.encode(worked_solution(p.meta[ENTRY_KEY]), add_special_tokens=False) for p in train]
        return [prompt_response_example(p.token_ids, (*ids, *eos)) for p, ids in zip(train, solutions, strict=True)]
    if cfg.agent.env != "calculator":
        raise ValueError(f"task.name=reasoning_gym warm-starts agent.env=calculator only, not {cfg.agent.env!r}")
    from asyncrl.rollout.chat import ChatRenderer, demonstration_ids
    from asyncrl.rollout.envs.base import Message
    from asyncrl.rollout.envs.calculator import calculator_env, calculator_tool, evaluate_expression
    from asyncrl.rollout.tools import ToolCall, format_tool_call

    renderer, tool, env = ChatRenderer(tokenizer, eos), calculator_tool(), calculator_env()

    async def openings() -> list[Any]:
        return [await env.reset(prompt) for prompt in train]

    examples: list[SFTExample] = []
    for prompt, opening in zip(train, asyncio.run(openings()), strict=True):
        expression = calculator_expression(prompt.meta[ENTRY_KEY])
        worked = [Message("assistant", f"#{prompt.answer}")]
        if expression is not None:
            call = format_tool_call(cfg.agent.tool_format, ToolCall(tool.name, {tool.arg: expression}), tool.tag)
            result = Message(env.tool_role, evaluate_expression(expression))
            worked = [Message("assistant", call), result, *worked]
        examples.append(demonstration_ids(renderer, [*opening.messages, *worked], opening.tools))
    return examples


def ensure_policy(cfg: Config) -> Path:
    """The model directory to start RL from (built and cached on first use)."""
    if cfg.model.path:
        return Path(cfg.model.path)
    cache = Path(cfg.sft.cache_dir)
    target = cache / f"tiny-sft-{warm_start_key(cfg)}"
    if (target / "warm_start.json").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="building-", dir=cache))
    t0 = time.perf_counter()
    try:
        run_warm_start(cfg, tmp)
        if target.exists():  # built concurrently by another run: keep theirs
            shutil.rmtree(tmp)
        else:
            tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"warm start built in {time.perf_counter() - t0:.0f}s: {target}")
    return target
