"""``python -m benchmarks prefix-reuse``: prefill tokens per multi-turn episode with and without prefix reuse.

Owns the side-by-side measure of ``rollout.prefix_reuse`` (docs/engine.md "Prefix reuse across turns").
For each seed, the same calculator episodes (``rollout.workflow=agent``, ``task.name=calculator``: a
tool call, the tool's result, the answer) are played twice through the run's own stages (the warm
start, ``build_engine``, ``build_workflow``: ``AgentWorkflow`` over ``LocalEngine``), reuse off then
on, with the same sampling seeds; all groups start at once, as the controller admits them. Per arm:
the engine's prefill tokens (prompt tokens computed), the tokens taken from retained sequences
instead, decode tokens, turns per episode, wall time (after one untimed warm-up group). Per seed:
the reduction of prefill tokens per episode and the wall-time ratio, and how many episodes are the
same token for token in both arms
(reuse changes where a prefix's KV comes from, not its value, up to float rounding that can flip a
near-tie draw; then the two arms play different episodes and their counts differ for that reason too).

``workload="scripted"`` (``--workload scripted``) needs no warm start: the same calculator openings,
but every episode runs ``agent.max_turns`` model turns sampled by the engine from the random-init
tiny policy (ended by EOS or ``agent.max_turn_tokens``), each followed by the environment's reply
scripted as the calculator's result of the question (a tool message rendered through the chat
template, ``ChatRenderer.env_ids``), so the turn structure is fixed and only the engine is measured.

Token counts do not depend on timing (given the episodes); wall time does, and on a shared machine it
is noisy. No weight update happens here: in training every update drops the retained KV (and slot
pressure evicts it), so a run saves at most what this bench measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.results import write_text_result
from benchmarks.stats import mean_ci95

if TYPE_CHECKING:
    from asyncrl.models import TinyModelSpec

from benchmarks import options
from benchmarks.options import add_json, add_overrides, add_seeds, parse_list

__all__ = ["add_arguments", "BASE_OVERRIDES", "run", "run_prefix_reuse_bench"]

BASE_OVERRIDES = (
    "rollout.workflow=agent",
    "task.name=calculator",
    "agent.tool_format=tag",
    "agent.max_turns=4",
    "agent.max_turn_tokens=48",
    "rollout.max_new_tokens=48",
    "rollout.group_size=4",
    "rollout.max_slots=32",
    "run.progress=false",
    "task.train_size=2048",
    "sft.steps=100",
    "sft.batch_size=16",
    "sft.warmup_steps=10",
)
"""The workload: calculator episodes (at most 4 turns) of the tiny policy after a short warm start on
worked conversations (enough to call the tool and answer: two turns, as in tests/integration/test_agent_run.py),
G=4, every episode in a slot of its own."""

NUM_PROMPTS = 8
"""Training prompts per seed (x group_size episodes per arm)."""


def _counters(engine: Any) -> dict[str, float]:
    s = engine.stats()
    keys = ("prefill_tokens", "prefix_reused_tokens", "prefix_hits", "generated_tokens", "retained_evicted")
    return {k: s[k] for k in keys}


async def _play_scripted(cfg: Any, engine: Any, tokenizer: Any, model: Any, num_prompts: int) -> list[dict[str, Any]]:
    """Scripted calculator conversations (module docstring); one record per episode."""
    from asyncrl.data.prompts import build_task
    from asyncrl.models import stop_token_ids
    from asyncrl.rollout.chat import ChatRenderer
    from asyncrl.rollout.envs.base import Message
    from asyncrl.rollout.envs.calculator import calculator_env, evaluate_expression
    from asyncrl.rollout.sampling import SamplingParams

    stops = stop_token_ids(tokenizer, model)
    renderer = ChatRenderer(tokenizer, stops)
    train, _, _ = build_task(cfg.task, tokenizer)
    r, turns = cfg.rollout, cfg.agent.max_turns

    async def episode(prompt: Any, seed: int) -> dict[str, Any]:
        opening = await calculator_env().reset(prompt)
        history = list(opening.messages)
        ids = list(renderer.opening_ids(history, opening.tools))
        reply = [Message("tool", evaluate_expression(str(prompt.meta["question"])))]
        sampling = SamplingParams(
            max_new_tokens=cfg.agent.max_turn_tokens or r.max_new_tokens,
            temperature=r.temperature,
            stop_token_ids=stops,
            seed=seed,
        )
        for turn in range(turns):
            (c,) = await engine.generate(ids, sampling)
            ids += c.output_ids
            if turn < turns - 1:
                closed_by = c.output_ids[-1] if c.finish_reason == "stop" else None
                ids += renderer.env_ids(history, reply, opening.tools, closed_by)
                history += [Message("assistant", tokenizer.decode(list(c.output_ids))), *reply]
        return {"token_ids": tuple(ids), "turns": turns, "reward": 0.0}

    prompts = train[:num_prompts]
    seeds = [cfg.run.seed * 100_003 + i * r.group_size + j for i in range(len(prompts)) for j in range(r.group_size)]
    return list(
        await asyncio.gather(
            *(episode(p, seeds[i * r.group_size + j]) for i, p in enumerate(prompts) for j in range(r.group_size))
        )
    )


async def _play(cfg: Any, engine: Any, tokenizer: Any, model: Any, num_prompts: int) -> list[dict[str, Any]]:
    """Every group of the seed's first ``num_prompts`` training prompts at once; (groups, wall seconds)."""
    from asyncrl.data.prompts import build_task
    from asyncrl.launch.stages import build_workflow
    from asyncrl.models import stop_token_ids
    from asyncrl.rollout.sampling import SamplingParams

    stops = stop_token_ids(tokenizer, model)
    workflow = build_workflow(cfg, tokenizer, stops)
    train, _, _ = build_task(cfg.task, tokenizer)
    r = cfg.rollout

    async def unscored(prompt: Any, completion: Any) -> tuple[float, str | None]:
        return 0.0, "the environment did not score the episode"

    def sampling(i: int) -> SamplingParams:
        seed = cfg.run.seed * 100_003 + i * r.group_size  # episode j of group i: seed + j
        return SamplingParams(
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            stop_token_ids=stops,
            seed=seed,
        )

    prompts = train[:num_prompts]
    groups = await asyncio.gather(
        *(workflow(engine, p, sampling(i), r.group_size, unscored, start_version=0) for i, p in enumerate(prompts))
    )
    return [
        {"token_ids": t.token_ids, "turns": len(t.turns), "reward": reward}
        for g in groups
        for t, reward in zip(g.trajectories, g.rewards, strict=True)
    ]


def _arm(cfg: Any, model_dir: Path, num_prompts: int, workload: str) -> tuple[dict[str, Any], list[tuple[int, ...]]]:
    """One arm: a fresh engine plays the episodes; (its row, every episode's token ids)."""
    from asyncrl.launch.stages import build_engine, init_process, load_model

    init_process(cfg)
    model, tokenizer = load_model(cfg, model_dir)
    engine = build_engine(cfg, model, tokenizer)
    try:
        play = _play_scripted if workload == "scripted" else _play
        started = time.perf_counter()
        records = asyncio.run(play(cfg, engine, tokenizer, model, num_prompts))
        wall = time.perf_counter() - started
        c = _counters(engine)
    finally:
        engine.close()
    episodes = len(records)
    turns = sum(e["turns"] for e in records)
    row = {
        "seed": cfg.run.seed,
        "prefix_reuse": cfg.rollout.prefix_reuse,
        "episodes": episodes,
        "turns_per_episode": turns / episodes,
        "prefill_tokens_per_episode": c["prefill_tokens"] / episodes,
        "reused_tokens_per_episode": c["prefix_reused_tokens"] / episodes,
        "decode_tokens_per_episode": c["generated_tokens"] / episodes,
        "prefix_hits": int(c["prefix_hits"]),
        "model_turns": turns,
        "retained_evicted": int(c["retained_evicted"]),
        "reward_mean": sum(e["reward"] for e in records) / episodes,
        "wall_s": wall,
    }
    return row, [e["token_ids"] for e in records]


def _random_tiny(spec: TinyModelSpec, scratch: Path) -> Path:
    """The random-init tiny policy of shape ``spec`` under ``scratch``, built on first use (both arms decode with
    the same weights; the bench removes ``scratch`` when it ends)."""
    from asyncrl.models import build_tiny_policy

    out = scratch / f"tiny-{abs(hash(spec))}"
    return out if out.is_dir() else Path(build_tiny_policy(out, spec))


def _compare(off: dict[str, Any], on: dict[str, Any], same: int) -> dict[str, Any]:
    return {
        "seed": off["seed"],
        "prefill_reduction": 1.0 - on["prefill_tokens_per_episode"] / off["prefill_tokens_per_episode"],
        "wall_ratio_on_over_off": on["wall_s"] / off["wall_s"],
        "episodes_identical": same,
        "episodes": off["episodes"],
    }


def run_prefix_reuse_bench(
    json_path: str | None,
    *,
    overrides: Sequence[str] = (),
    seeds: Sequence[int] = (0, 1, 2),
    num_prompts: int = NUM_PROMPTS,
    workload: str = "calculator",
) -> dict[str, Any]:
    """Both arms per seed (see the module docstring); prints a table, writes ``json_path``. The policy is
    ``model.path`` when an override sets it, else the workload's warm start (built once, cached)."""
    from asyncrl.config import load_config
    from asyncrl.launch.warm_start import ensure_policy
    from asyncrl.models import tiny_spec

    if workload not in ("calculator", "scripted"):
        raise ValueError(f"prefix-reuse workload {workload!r}: calculator or scripted")

    rows: list[dict[str, Any]] = []
    per_seed: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="asyncrl-prefix-reuse-") as scratch:

        def policy(cfg: Any) -> Path:
            if workload == "scripted" and not cfg.model.path:
                return _random_tiny(tiny_spec(cfg.sft), Path(scratch))
            return ensure_policy(cfg)

        warm = load_config(None, [*BASE_OVERRIDES, *overrides, f"run.seed={seeds[0]}"])
        _arm(warm, policy(warm), 1, workload)  # untimed: the process's first forward pays one-off costs
        for seed in seeds:
            arms = {}
            for reuse in (False, True):
                cfg = load_config(
                    None, [*BASE_OVERRIDES, *overrides, f"run.seed={seed}", f"rollout.prefix_reuse={reuse}"]
                )
                arms[reuse] = _arm(cfg, policy(cfg), num_prompts, workload)
                rows.append(arms[reuse][0])
            same = sum(a == b for a, b in zip(arms[False][1], arms[True][1], strict=True))
            per_seed.append(_compare(arms[False][0], arms[True][0], same))
    result = {
        "bench": "prefix-reuse",
        "workload": {
            "name": workload,
            "overrides": [*BASE_OVERRIDES, *overrides],
            "prompts_per_seed": num_prompts,
            "model": "model.path, else (calculator) the workload's warm start (launch.warm_start.ensure_policy) or "
            "(scripted) the random-init tiny policy of the config's shape (models.build_tiny_policy, sft.*)",
        },
        "rows": rows,
        "per_seed": per_seed,
        "prefill_reduction": mean_ci95([s["prefill_reduction"] for s in per_seed]),
        "wall_ratio_on_over_off": mean_ci95([s["wall_ratio_on_over_off"] for s in per_seed]),
    }
    _print(result)
    if json_path:
        write_text_result(json_path, json.dumps(result, indent=2) + "\n")  # never over a file (asyncrl.results)
    return result


def _print(result: dict[str, Any]) -> None:
    print(f"{'seed':>4} {'reuse':>5} {'turns/ep':>8} {'prefill/ep':>10} {'reused/ep':>9} {'decode/ep':>9} {'wall':>4}")
    for r in result["rows"]:
        print(
            f"{r['seed']:>4} {r['prefix_reuse']!s:>5} {r['turns_per_episode']:>8.2f} "
            f"{r['prefill_tokens_per_episode']:>10.1f} {r['reused_tokens_per_episode']:>9.1f} "
            f"{r['decode_tokens_per_episode']:>9.1f} {r['wall_s']:>6.1f}"
        )
    for s in result["per_seed"]:
        print(
            f"seed {s['seed']}: prefill -{100 * s['prefill_reduction']:.1f}%, "
            f"wall x{s['wall_ratio_on_over_off']:.2f}, "
            f"{s['episodes_identical']}/{s['episodes']} episodes identical"
        )
    red, wall = result["prefill_reduction"], result["wall_ratio_on_over_off"]
    print(
        f"prefill reduction {red['mean']:.3f} (95% CI {_fmt(red['low'])}..{_fmt(red['high'])}); "
        f"wall on/off {wall['mean']:.3f} (95% CI {_fmt(wall['low'])}..{_fmt(wall['high'])})"
    )


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json``, ``--set``, ``--model``, ``--seeds``, ``--workload``."""
    add_json(parser)
    add_overrides(parser, "model directory (default: the calculator's warm-started policy)")
    add_seeds(parser, "0,1,2")
    parser.add_argument(
        "--workload",
        default="calculator",
        choices=("calculator", "scripted"),
        help="calculator (the default: the policy's own episodes) or scripted",
    )


def run(args: argparse.Namespace) -> None:
    """Both arms per seed."""
    seeds = parse_list(args.seeds, int, (0, 1, 2), "--seeds")
    run_prefix_reuse_bench(args.json, overrides=options.overrides(args), seeds=seeds, workload=args.workload)
