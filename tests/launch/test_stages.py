"""``launch.stages``: every caller builds its stages there, with the same arguments from the same config.

Each caller is run until it constructs the stage under test, whose constructor is replaced by a
recorder that stops it (``_Built``): the local launcher, the Ray engine worker and trainer rank,
the trainer process's child, ``asyncrl eval``, the async benchmark's calibration and the
headline benchmark's snapshot evaluation. A last test fails when a ``LocalEngine(`` or ``Trainer(`` is built
anywhere else in ``src`` (or a run seeds or sets threads elsewhere), but a short allow-list.
"""

from __future__ import annotations

import ast
import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import asyncrl.launch.stages as stages
import asyncrl.models
import asyncrl.rollout.engine
import asyncrl.trainer.trainer
from asyncrl.cli import main
from asyncrl.config import Config, load_config, with_values
from asyncrl.rollout.workflow import run_episode

SRC = Path(__file__).resolve().parents[2] / "src" / "asyncrl"

OVERRIDES = [
    "rollout.max_slots=7",
    "rollout.max_prompt_len=40",
    "rollout.max_new_tokens=20",
    "eval.max_new_tokens=33",
    "rollout.interrupt_mode=keep",
    "model.device=cuda:1",
    "rollout.temperature=0.7",
    "controller.total_steps=3",
    "rollout.prefix_reuse=true",
    "eval.greedy=false",
    "eval.samples_per_prompt=3",
    "task.eval_size=5",
    "trainer.lr=0.002",
]
"""Settings that differ from the defaults, so a caller that drops one is seen. ``cuda:1`` is never
reached: the model loads on the CPU and the stage constructors only record their arguments."""


class _Built(Exception):
    """Raised by a recording constructor: the caller got as far as building the stage."""


class _FakeEngine:
    def close(self) -> None:
        pass


@pytest.fixture
def overrides(tiny_policy_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """``OVERRIDES`` with the tiny policy; every model loads on the CPU whatever the device asked."""
    real = asyncrl.models.load_policy
    monkeypatch.setattr(asyncrl.models, "load_policy", lambda path, device="cpu", dtype="float32": real(path))
    threads = torch.get_num_threads()
    yield [*OVERRIDES, f"model.path={tiny_policy_dir}"]
    torch.set_num_threads(threads)


def _record(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, *, stop: bool = True) -> list[dict[str, Any]]:
    """Replace ``module.name`` (a stage class) by a recorder of its arguments (raising ``_Built``
    when ``stop``; else a stand-in engine)."""
    seen: list[dict[str, Any]] = []

    def record(*args: Any, **kwargs: Any) -> Any:
        seen.append({"args": args, **kwargs})
        if stop:
            raise _Built(name)
        return _FakeEngine()

    monkeypatch.setattr(module, name, record)
    return seen


def _local(cfg: Config, tmp_path: Path) -> None:
    from asyncrl.launch import local

    asyncio.run(local._train_async(cfg, tmp_path / "run"))


def test_every_engine_is_built_with_the_configs_slots_context_mode_and_device(
    overrides: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncrl.launch.ray_actors import EngineWorker
    from benchmarks.async_bench import _engine_alone
    from benchmarks.headline import evaluate_snapshots

    seen = _record(monkeypatch, asyncrl.rollout.engine, "LocalEngine")
    cfg = load_config(None, overrides)
    callers = {
        "local launcher": lambda: _local(cfg, tmp_path),
        "ray engine worker": lambda: EngineWorker(cfg.model.path, cfg),
        "asyncrl eval": lambda: main(["eval", *(a for o in overrides for a in ("--set", o))]),
        "bench calibration": lambda: asyncio.run(_engine_alone(overrides, seconds=0.1)),
        "bench snapshots": lambda: evaluate_snapshots(overrides, [{"path": cfg.model.path}]),
    }
    for i, (name, call) in enumerate(callers.items()):
        with pytest.raises(_Built):
            call()
        assert len(seen) == i + 1, f"{name} built no LocalEngine"
    expected = {
        "max_slots": 7,
        "max_seq_len": 40 + 33,
        "interrupt_mode": "keep",
        "device": "cuda:1",
        "prefix_reuse": True,
    }
    for name, got in zip(callers, seen, strict=True):
        assert {k: v for k, v in got.items() if k != "args"} == expected, name


def test_every_trainer_is_built_with_the_configs_settings_and_device(
    overrides: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncrl.launch.ray_actors import TrainerRank
    from asyncrl.launch.trainer_process import _serve

    _record(monkeypatch, asyncrl.rollout.engine, "LocalEngine", stop=False)
    seen = _record(monkeypatch, asyncrl.trainer.trainer, "Trainer")
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # the child's handlers, not the test's
    cfg = load_config(None, [*overrides, "controller.trainer_process=false"])
    replies: list[tuple[str, Any]] = []

    class Conn:
        def send(self, reply: tuple[str, Any]) -> None:
            replies.append(reply)

    with pytest.raises(_Built):
        _local(cfg, tmp_path)
    with pytest.raises(_Built):
        TrainerRank(0, 1, str(cfg.model.path), cfg).setup("tcp://unused")
    _serve(Conn(), str(cfg.model.path), cfg)  # the child reports the failure instead of raising
    assert [r[0] for r in replies] == ["error"] and "_Built" in replies[0][1]
    assert len(seen) == 3
    for got in seen:
        _model, train_cfg, algo_cfg = got["args"]
        assert (train_cfg, algo_cfg) == (cfg.trainer, cfg.algo)
        assert got["tokenizer"] is not None
        kwargs = {k: v for k, v in got.items() if k not in ("args", "tokenizer")}
        assert kwargs == {"temperature": 0.7, "device": "cuda:1", "total_steps": 3}


def test_asyncrl_eval_and_a_training_run_evaluate_with_the_same_settings(
    overrides: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncrl.launch import local

    _record(monkeypatch, asyncrl.rollout.engine, "LocalEngine", stop=False)
    _record(monkeypatch, asyncrl.trainer.trainer, "Trainer", stop=False)
    seen = _record(monkeypatch, stages, "evaluate")
    cfg = load_config(None, [*overrides, "controller.trainer_process=false"])
    with pytest.raises(_Built):  # the accuracy before RL
        local.train(with_values(cfg, {"run.run_dir": str(tmp_path / "run")}))
    with pytest.raises(_Built):
        main(["eval", *(a for o in overrides for a in ("--set", o))])
    train, evaluate = seen
    assert train["args"][1] == evaluate["args"][1] and len(train["args"][1]) == 5  # the same held-out prompts
    del train["args"], evaluate["args"]
    assert train == evaluate
    assert (train["greedy"], train["samples_per_prompt"], train["max_new_tokens"]) == (False, 3, 33)


def test_reward_services_get_the_configs_workers_timeout_and_retries() -> None:
    reward = ["reward.num_workers=3", "reward.timeout_s=4", "reward.max_retries=5"]
    cfg = load_config(None, ["task.verifier=math", *reward])
    score, service = stages.build_scoring(cfg, tokenizer=None)
    assert service is not None and callable(score)
    assert (service.num_workers, service.timeout_s, service.max_retries) == (3, 4.0, 5)
    one = stages.build_reward_service(cfg, num_workers=1)  # a Ray reward worker's own service
    assert (one.num_workers, one.timeout_s, one.max_retries) == (1, 4.0, 5)
    asyncio.run(service.close())
    asyncio.run(one.close())
    assert stages.build_scoring(load_config(None, []), tokenizer=None)[1] is None  # arithmetic: inline


def test_the_engines_context_holds_the_longest_training_or_evaluation_response() -> None:
    cfg = load_config(None, ["rollout.max_prompt_len=40", "rollout.max_new_tokens=50", "eval.max_new_tokens=30"])
    assert stages.engine_max_seq_len(cfg) == 90
    assert stages.engine_max_seq_len(with_values(cfg, {"eval.max_new_tokens": 70})) == 110


# ------------------------------------------------------------------------------ no construction elsewhere
BUILT_HERE = "launch/stages.py"

CONSTRUCTION_EXCEPTIONS: dict[tuple[str, str], str] = {
    ("rollout/server.py", "LocalEngine"): "`asyncrl serve engine`, sized by its flags (rollout cannot import launch)",
    ("rollout/batch_generate.py", "LocalEngine"): "`asyncrl generate`, sized by its input and flags, not a config",
    ("service/sampling.py", "LocalEngine"): (
        "`asyncrl serve training`: one engine per served weight version, sized by the service's flags, not a run's "
        "config"
    ),
    ("trainer/trainer.py", "Trainer"): "a follower rank mirrors the leader's Trainer from the arguments sent",
}
"""(file under src/asyncrl, class) -> why it may be constructed there: none is a stage of a run. The
benchmarks (``benchmarks/``, outside the product) build their own engines and trainers at explicit sizes."""

PROCESS_EXCEPTIONS: dict[tuple[str, str], str] = {
    ("models.py", "manual_seed"): "the tiny model's random init, seeded by its spec",
    ("trainer/sft.py", "manual_seed"): "the warm start's own seed (sft.seed)",
    ("trainer/lora.py", "manual_seed"): "LoRA adapters' init, seeded by the LoRA config",
    ("service/model.py", "manual_seed"): "`asyncrl serve training`: a created model's init, seeded by the request",
}
"""(file under src/asyncrl, torch function) -> why a process's global seed or threads may be set there."""


def _calls(tree: ast.AST) -> list[str]:
    """Names of the stage classes constructed and of the global torch settings called in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("LocalEngine", "Trainer"):
            found.append(func.id)
        elif isinstance(func, ast.Attribute) and func.attr in ("LocalEngine", "Trainer"):
            found.append(func.attr)
        elif (
            isinstance(func, ast.Attribute)
            and func.attr in ("manual_seed", "set_num_threads")
            and isinstance(func.value, ast.Name)
            and func.value.id == "torch"
        ):
            found.append(func.attr)
    return found


def test_stages_are_built_nowhere_but_in_the_builder() -> None:
    allowed = {**CONSTRUCTION_EXCEPTIONS, **PROCESS_EXCEPTIONS}
    used: set[tuple[str, str]] = set()
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == BUILT_HERE:
            continue
        for name in _calls(ast.parse(path.read_text(), str(path))):
            if (rel, name) in allowed:
                used.add((rel, name))
            else:
                problems.append(f"{rel}: {name}(...) outside launch/stages.py")
    problems += [f"allow-list entry {key} matches nothing: remove it" for key in allowed.keys() - used]
    assert not problems, "\n".join(problems)


def test_the_check_finds_a_planted_construction() -> None:
    planted = "from x import LocalEngine, trainer\nLocalEngine(m, t)\ntrainer.Trainer(m)\ntorch.manual_seed(0)\n"
    assert _calls(ast.parse(planted)) == ["LocalEngine", "Trainer", "manual_seed"]


def test_a_workflow_named_by_pkg_module_function_is_imported_and_must_be_callable() -> None:
    cfg = load_config(None, ["rollout.workflow=asyncrl.rollout.workflow:run_episode"])
    assert stages.build_workflow(cfg, tokenizer=None, stop_token_ids=()) is run_episode
    with pytest.raises(TypeError, match=r"rollout.workflow='math:pi' is not callable"):
        stages.build_workflow(with_values(cfg, {"rollout.workflow": "math:pi"}), tokenizer=None, stop_token_ids=())
