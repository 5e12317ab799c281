"""Every stage of a run built from the config, in one place: process setup, engine, trainer, reward, evaluator.

Whoever runs a stage builds it here, so a setting reaches every copy of the stage the same way:

=============================  ==========================================================================
``init_process(cfg)``          torch threads (``run.torch_threads``) then seeds (``run.seed``): the first
                               thing each process of a run does (launchers, trainer process, Ray actors)
``load_model(cfg, dir)``       policy + tokenizer on ``model.device`` (or a stage's own) in ``model.dtype``
``engine_max_seq_len(cfg)``    an engine's context: the longest prompt plus the longest training or
                               evaluation response (or agent episode, ``agent.max_tokens``)
``build_engine(...)``          ``rollout.backend``: ``LocalEngine`` | ``VLLMEngine`` | SGLang clients
``build_remote_pool(urls)``    an ``EnginePool`` of ``RemoteEngine`` clients of running servers
``build_trainer(...)``         ``Trainer`` (trainer and algo settings, sampling temperature, total steps)
``build_reward_service(cfg)``  the ``RewardService`` (workers, timeout, retries)
``build_scoring(...)``         the ``score`` callable (``task.verifier``) and the service it needs, if any
                               (``build_score``: over a service the caller has, e.g. Ray's reward pool)
``build_workflow(...)``        what one episode is (``rollout.workflow``): ``run_episode``, an ``AgentWorkflow``
                               over ``agent.*`` and its environment, an ``OpenAIAgentWorkflow`` over
                               ``agent.entrypoint``, or a ``pkg.module:function``
``build_evaluator(...)``       held-out evaluation with the run's ``eval.*`` settings (``evaluate_once``:
                               scoring built, evaluation run, service closed: ``asyncrl eval``)
``stage_device(cfg, gpus)``    where a Ray actor's stage runs (``cuda`` when its bundle holds a GPU)
=============================  ==========================================================================

Callers: ``launch.local`` and ``launch.ray`` (the driver), ``launch.ray_actors`` (engine workers,
trainer ranks, reward workers), ``launch.trainer_process`` (its child), ``asyncrl eval`` and
``asyncrl train`` (cli), and the benches that build stages from a config (``bench.async_bench``'s
calibration, ``bench.headline``'s snapshot evaluation). ``tests/launch/test_stages.py`` fails when
a ``LocalEngine(`` or ``Trainer(`` is built anywhere else in ``src`` (but a short allow-list).
The stage classes are imported where they are built: a process pays only for the stages it builds.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.choices import RolloutBackend, choice_error
from asyncrl.config import Config
from asyncrl.controller.evaluate import EvalResult, eval_kwargs, evaluate
from asyncrl.controller.scoring import make_score_fn
from asyncrl.reward.custom import import_callable
from asyncrl.rollout.api import RolloutEngine
from asyncrl.rollout.workflow import ScoreFn, Workflow, run_episode
from asyncrl.types import Prompt

if TYPE_CHECKING:
    from asyncrl.reward.service import RewardScorer, RewardService
    from asyncrl.rollout.pool import EnginePool
    from asyncrl.trainer.trainer import Trainer

__all__ = [
    "Evaluator",
    "build_engine",
    "build_evaluator",
    "build_remote_pool",
    "build_reward_service",
    "build_score",
    "build_scoring",
    "build_trainer",
    "build_workflow",
    "configure_threads",
    "engine_max_seq_len",
    "evaluate_once",
    "init_process",
    "load_model",
    "seed_everything",
    "stage_device",
    "usable_cores",
]


# ----------------------------------------------------------------------------------- the process
def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a cgroup or ``taskset`` narrows; the
    machine's count where affinity is unknown)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def configure_threads(cfg: Config, threads: int | None = None) -> None:
    """torch's intra-op threads: ``threads``, else ``run.torch_threads`` (0 leaves torch's default)."""
    n = cfg.run.torch_threads if threads is None else threads
    if n > 0:
        import torch

        torch.set_num_threads(n)


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def init_process(cfg: Config) -> None:
    """What every process of a run does before it builds a stage: threads, then seeds."""
    configure_threads(cfg)
    seed_everything(cfg.run.seed)


def stage_device(cfg: Config, gpus: float = 0.0) -> str:
    """The device of a stage given ``gpus`` of its own (a Ray bundle's): ``cuda`` (Ray shows an actor
    only its GPUs) when it has any, else ``model.device``."""
    return "cuda" if gpus > 0 else cfg.model.device


def load_model(cfg: Config, model_dir: str | Path, *, device: str | None = None) -> tuple[Any, Any]:
    """(policy, tokenizer) from ``model_dir`` on ``device`` (default ``model.device``) in ``model.dtype``."""
    from asyncrl.models import load_policy

    return load_policy(model_dir, device=device or cfg.model.device, dtype=cfg.model.dtype)


# ----------------------------------------------------------------------------------- the stages
def engine_max_seq_len(cfg: Config) -> int:
    """The context an engine holds per slot: the longest prompt plus the longest response it is asked
    for, in training (``rollout.max_new_tokens``) or in evaluation (``eval.max_new_tokens``); with
    ``rollout.workflow=agent`` or ``openai_agent``, an episode's tokens after its opening (``agent.max_tokens``) too."""
    response = max(cfg.rollout.max_new_tokens, cfg.eval.max_new_tokens)
    if cfg.rollout.workflow in ("agent", "openai_agent"):
        response = max(response, cfg.agent.max_tokens)
    return cfg.rollout.max_prompt_len + response


def build_engine(cfg: Config, model: Any, tokenizer: Any, *, device: str | None = None) -> RolloutEngine:
    """The engine of ``rollout.backend`` for ``model``, with the run's slots, context and interrupt mode.

    ``local``: the ``LocalEngine`` of ``model`` (and ``rollout.prefix_reuse``) on ``device`` (default
    ``model.device``: the engine's tensors go where its weights are). ``vllm``: a ``VLLMEngine`` over a scratch
    copy of ``model`` and ``tokenizer`` saved as a Hugging Face checkpoint (so it starts from exactly these
    weights; removed at ``close``), in ``model.dtype``, seeded with ``run.seed``. ``sglang``: clients of the running
    SGLang servers of ``rollout.sglang_urls``, which start from ``model``'s weights (``_build_sglang``)."""
    match cfg.rollout.backend:
        case "local":
            from asyncrl.rollout.engine import LocalEngine

            return LocalEngine(
                model,
                tokenizer,
                max_slots=cfg.rollout.max_slots,
                max_seq_len=engine_max_seq_len(cfg),
                interrupt_mode=cfg.rollout.interrupt_mode,
                device=device or cfg.model.device,
                prefix_reuse=cfg.rollout.prefix_reuse,
            )
        case "vllm":
            import tempfile

            from asyncrl.rollout.vllm_engine import VLLMEngine

            scratch = Path(tempfile.mkdtemp(prefix="asyncrl-vllm-model-"))
            model.save_pretrained(str(scratch), safe_serialization=True)
            tokenizer.save_pretrained(str(scratch))
            return VLLMEngine(
                scratch,
                max_slots=cfg.rollout.max_slots,
                max_seq_len=engine_max_seq_len(cfg),
                interrupt_mode=cfg.rollout.interrupt_mode,
                dtype=cfg.model.dtype,
                seed=cfg.run.seed,
                owns_model_dir=True,
                tensor_parallel_size=cfg.rollout.tensor_parallel_size,
                gpu_memory_fraction=cfg.rollout.gpu_memory_fraction,
            )
        case "sglang":
            return _build_sglang(cfg, model)
        case other:
            raise choice_error(other, RolloutBackend, "rollout.backend")


def _build_sglang(cfg: Config, model: Any) -> RolloutEngine:
    """``SGLangEngine`` clients of ``rollout.sglang_urls`` (an ``EnginePool`` of them for several), each loading
    ``model``'s weights, saved under ``trainer.weight_export_dir``, before its first request."""
    import tempfile

    from asyncrl.rollout.sglang_engine import SGLangEngine

    urls = [u.strip() for u in cfg.rollout.sglang_urls.split(",") if u.strip()]
    root = Path(cfg.trainer.weight_export_dir or tempfile.gettempdir())
    root.mkdir(parents=True, exist_ok=True)
    initial = Path(tempfile.mkdtemp(prefix="asyncrl-sglang-initial-", dir=root))
    model.save_pretrained(str(initial), safe_serialization=True)
    engines = [
        SGLangEngine(
            url,
            vocab_size=int(model.config.vocab_size),
            max_seq_len=engine_max_seq_len(cfg),
            interrupt_mode=cfg.rollout.interrupt_mode,
            initial_weights=initial,
            owns_initial_weights=i == 0,
        )
        for i, url in enumerate(urls)
    ]
    if len(engines) == 1:
        return engines[0]
    from asyncrl.rollout.pool import EnginePool

    return EnginePool(engines, max_restarts=0)


def build_remote_pool(urls: str) -> EnginePool:
    """An ``EnginePool`` of ``RemoteEngine`` clients of the comma-separated server ``urls``
    (``launch.engine_urls``); servers that are not ours to restart."""
    from asyncrl.rollout.pool import EnginePool
    from asyncrl.rollout.remote import RemoteEngine

    return EnginePool([RemoteEngine(u.strip()) for u in urls.split(",") if u.strip()], max_restarts=0)


def build_trainer(cfg: Config, model: Any, tokenizer: Any, *, device: str | None = None) -> Trainer:
    """The ``Trainer`` of ``model`` with the run's trainer and algo settings, on ``device`` (default
    ``model.device``); it recomputes log-probs at the engine's sampling temperature."""
    from asyncrl.trainer.trainer import Trainer

    return Trainer(
        model,
        cfg.trainer,
        cfg.algo,
        temperature=cfg.rollout.temperature,
        device=device or cfg.model.device,
        tokenizer=tokenizer,
        total_steps=cfg.controller.total_steps,
    )


def build_reward_service(cfg: Config, *, num_workers: int | None = None) -> RewardService:
    """The ``RewardService`` with the run's ``reward.*`` settings (``num_workers``: a Ray reward worker's
    own service runs one)."""
    from asyncrl.reward.service import RewardService

    r = cfg.reward
    return RewardService(
        num_workers=r.num_workers if num_workers is None else num_workers,
        timeout_s=r.timeout_s,
        max_retries=r.max_retries,
    )


def build_score(cfg: Config, tokenizer: Any, service: RewardScorer | None = None) -> ScoreFn:
    """The ``score`` callable of ``task.verifier`` over ``service`` (a ``RewardService`` or a Ray
    reward pool; None: only the inline ``arithmetic`` verifier)."""
    return make_score_fn(cfg.task.verifier, tokenizer, service)


def build_scoring(cfg: Config, tokenizer: Any) -> tuple[ScoreFn, RewardService | None]:
    """The ``score`` callable of ``task.verifier`` and the ``RewardService`` it runs in (None for the
    inline ``arithmetic`` verifier); the caller closes the service."""
    service = None if cfg.task.verifier == "arithmetic" else build_reward_service(cfg)
    return build_score(cfg, tokenizer, service), service


# ----------------------------------------------------------------------------------- the workflow
def build_workflow(cfg: Config, tokenizer: Any, stop_token_ids: tuple[int, ...]) -> Workflow:
    """What one episode is (``rollout.workflow``): ``single_turn`` -> ``rollout.workflow.run_episode``;
    ``agent`` -> an ``AgentWorkflow`` over ``agent.*`` with a fresh ``agent.env`` environment per episode
    (its turns end at ``stop_token_ids``; ``agent.tool_latency`` seeded by ``run.seed``); ``openai_agent`` ->
    an ``OpenAIAgentWorkflow`` running the agent ``agent.entrypoint`` through the door;
    ``pkg.module:function`` -> that callable (imported here)."""
    match cfg.rollout.workflow:
        case "single_turn":
            return run_episode
        case "agent":
            from asyncrl.rollout.agent import AgentSettings, AgentWorkflow
            from asyncrl.rollout.envs.latency import ToolLatency

            a = cfg.agent
            latency = ToolLatency(a.tool_latency, a.tool_latency_median_s, a.tool_latency_sigma, seed=cfg.run.seed)
            settings = AgentSettings(
                tool_format=a.tool_format,
                max_turns=a.max_turns,
                max_tokens=a.max_tokens,
                max_turn_tokens=a.max_turn_tokens,
                stop_at_tool_close=a.stop_at_tool_close,
                malformed_penalty=a.malformed_penalty,
                tool_latency=latency,
            )
            return AgentWorkflow(tokenizer, _env_factory(cfg), settings, end_of_turn_ids=stop_token_ids)
        case "openai_agent":
            from asyncrl.rollout.openai_workflow import DoorSettings, OpenAIAgentWorkflow

            a = cfg.agent
            door = DoorSettings(
                tool_format=a.tool_format,
                max_tokens=a.max_tokens,
                max_turn_tokens=a.max_turn_tokens,
                max_seq_len=engine_max_seq_len(cfg),
                episode_mode=a.episode_mode,
                reward_discount=a.reward_discount,
            )
            agent = import_callable(str(a.entrypoint), "agent.entrypoint=")
            return OpenAIAgentWorkflow(tokenizer, agent, door, end_of_turn_ids=stop_token_ids)
        case spec:
            return import_callable(spec, "rollout.workflow=")  # type: ignore[return-value]


def _env_factory(cfg: Config) -> Any:
    """A maker of ``agent.env`` environments (one per episode) through the registry (``rollout.envs.registry``:
    entry points, ``gym:...``, ``pkg.module:make``), with ``agent.tool_timeout_s``, ``run.seed`` and the reward
    sandbox as the code runner (rollout imports no reward code)."""
    from asyncrl.reward.python_tool import run_python
    from asyncrl.rollout.envs.base import EnvOptions
    from asyncrl.rollout.envs.registry import env_maker

    options = EnvOptions(tool_timeout_s=cfg.agent.tool_timeout_s, seed=cfg.run.seed, code_runner=run_python)
    return env_maker(cfg.agent.env, options)


# ----------------------------------------------------------------------------------- evaluation
@dataclass(frozen=True)
class Evaluator:
    """Held-out evaluation of one engine: ``await evaluator()`` -> accuracy, reward, response length."""

    engine: RolloutEngine
    prompts: Sequence[Prompt]
    score: ScoreFn
    kwargs: dict[str, Any] = field(default_factory=dict)
    """``controller.evaluate.evaluate``'s keyword arguments (``eval_kwargs`` of the run's config; with a
    multi-turn ``rollout.workflow``, the workflow that plays each held-out episode)."""

    async def __call__(self) -> EvalResult:
        return await evaluate(self.engine, self.prompts, self.score, **self.kwargs)


def build_evaluator(
    cfg: Config,
    engine: RolloutEngine,
    prompts: Sequence[Prompt],
    score: ScoreFn,
    stop_token_ids: tuple[int, ...],
    *,
    greedy: bool | None = None,
    workflow: Workflow | None = None,
) -> Evaluator:
    """Evaluation of ``engine`` on ``prompts`` with the run's ``eval.*`` settings (``greedy``: force
    greedy decoding or sampling regardless of ``eval.greedy``). ``workflow``: a multi-turn one plays
    each held-out episode itself (its reward: the environment's); single-turn (None or ``run_episode``)
    generates answers for the verifier."""
    kwargs = eval_kwargs(cfg.eval, cfg.rollout.temperature, stop_token_ids)
    if workflow is not None and workflow is not run_episode:
        kwargs["workflow"] = workflow
    if greedy is not None:
        kwargs["greedy"] = greedy
    return Evaluator(engine, tuple(prompts), score, kwargs)


async def evaluate_once(
    cfg: Config, engine: RolloutEngine, prompts: Sequence[Prompt], tokenizer: Any, stop_token_ids: tuple[int, ...]
) -> EvalResult:
    """One evaluation outside a run (``asyncrl eval``, the headline bench's snapshots): the scoring
    built, the evaluator run, the reward service closed."""
    score, service = build_scoring(cfg, tokenizer)
    try:
        workflow = build_workflow(cfg, tokenizer, stop_token_ids)
        return await build_evaluator(cfg, engine, prompts, score, stop_token_ids, workflow=workflow)()
    finally:
        if service is not None:
            await service.close()
