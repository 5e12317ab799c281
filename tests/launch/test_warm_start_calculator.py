"""The multi-turn warm start of ``task.name=calculator``: worked conversations of the training problems
only (never a held-out one), built as an episode builds its sequence, the loss on the assistant turns
only, in the run's call format; a cache key that changes with everything that changes the result; a
tiny build that runs and is reused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.data.calculator import demonstrates_call, make_calculator_splits
from asyncrl.launch.warm_start import ensure_policy, warm_start_examples, warm_start_key
from asyncrl.models import TinyModelSpec, load_policy, tiny_spec
from tests.repo_paths import CONFIGS

CALC = [
    "task.name=calculator",
    "rollout.workflow=agent",
    "agent.tool_format=tag",
    "task.train_size=64",
    "task.eval_size=256",
]


def test_examples_learn_the_assistant_turns_only(tiny_policy_dir) -> None:
    _, tokenizer = load_policy(tiny_policy_dir, device="cpu", dtype="float32")
    cfg = load_config(None, CALC)
    examples = warm_start_examples(cfg, tokenizer)
    train, _ = make_calculator_splits(cfg.task.seed, cfg.task.train_size, 0)
    assert len(examples) == len(train) == 64
    eos = tokenizer.eos_token
    for (ids, mask), problem in zip(examples, train, strict=True):
        assert len(ids) == len(mask)
        learned = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
        assert learned == f"<calc>{problem.question}</calc>{eos}#{problem.answer}{eos}"
        context = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
        assert problem.question in context and problem.answer in context  # the question and the tool's result


def test_a_tool_call_fraction_makes_the_rest_answer_directly(tiny_policy_dir) -> None:
    """``sft.tool_call_fraction=0.3``: the problems ``demonstrates_call`` picks keep the call, the others learn
    ``#answer`` as the first assistant turn, token for token as an episode would build it."""
    _, tokenizer = load_policy(tiny_policy_dir, device="cpu", dtype="float32")
    cfg = load_config(None, [*CALC, "task.train_size=400", "sft.tool_call_fraction=0.3"])
    examples = warm_start_examples(cfg, tokenizer)
    train, _ = make_calculator_splits(cfg.task.seed, cfg.task.train_size, 0)
    eos, calling = tokenizer.eos_token, 0
    for (ids, mask), problem in zip(examples, train, strict=True):
        learned = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
        if demonstrates_call(problem.question, 0.3):
            calling += 1
            assert learned == f"<calc>{problem.question}</calc>{eos}#{problem.answer}{eos}"
        else:
            assert learned == f"#{problem.answer}{eos}"
            context = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
            assert problem.question in context and problem.answer not in context  # no tool result shown
    assert 0.2 < calling / len(train) < 0.4


@pytest.mark.parametrize("fmt", ["hermes", "json"])
def test_examples_write_the_call_in_the_runs_format(tiny_policy_dir, fmt: str) -> None:
    _, tokenizer = load_policy(tiny_policy_dir, device="cpu", dtype="float32")
    cfg = load_config(None, [*CALC, f"agent.tool_format={fmt}"])
    ids, mask = warm_start_examples(cfg, tokenizer)[0]
    learned = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert '"calculator"' in learned and ("<tool_call>" in learned) == (fmt == "hermes")


def test_demonstrations_never_hold_a_held_out_problem() -> None:
    for seed in (0, 1234):
        train, held_out = make_calculator_splits(seed, 2000, 256)
        assert not {p.question for p in train} & {p.question for p in held_out}
        assert len({p.question for p in held_out}) > 200


def test_the_key_follows_what_changes_the_result() -> None:
    base = warm_start_key(load_config(None, CALC))
    assert warm_start_key(load_config(None, [*CALC, "task.eval_size=512"])) == base  # not in the demos
    for change in ("agent.tool_format=hermes", "task.train_size=128", "task.seed=7", "sft.steps=10"):
        assert warm_start_key(load_config(None, [*CALC, change])) != base, change
    arithmetic = warm_start_key(load_config(None, []))
    assert warm_start_key(load_config(None, ["agent.tool_format=tag"])) == arithmetic  # single-turn: unchanged
    assert warm_start_key(load_config(None, [*CALC, "task.calculator_max_digits=3"])) != base
    assert warm_start_key(load_config(None, [*CALC, "sft.tool_call_fraction=0.3"])) != base
    assert warm_start_key(load_config(None, [*CALC, "sft.tool_call_fraction=0.5"])) not in (
        base,
        warm_start_key(load_config(None, [*CALC, "sft.tool_call_fraction=0.3"])),
    )


def test_fields_added_at_their_defaults_keep_every_existing_key() -> None:
    """The keys of the cached warm starts built before ``task.calculator_max_digits`` existed (computed at
    the commit before it): a new field at its default must not orphan a cache."""
    assert warm_start_key(load_config(None, [])) == "29e4437d1ea3"
    assert warm_start_key(load_config(None, ["task.form=repeat", "task.max_terms=300"])) == "bc33b0febc22"
    # the config of that commit
    calculator = [
        "task.name=calculator",
        "task.train_size=4096",
        "sft.steps=800",
        "sft.batch_size=32",
        "sft.lr=3e-3",
        "sft.warmup_steps=10",
        "rollout.workflow=agent",
        "agent.tool_format=tag",
    ]
    assert warm_start_key(load_config(None, calculator)) == "fd049aab88e0"
    assert warm_start_key(load_config(None, [*calculator, "task.calculator_max_digits=0"])) == "fd049aab88e0"
    # sft.tool_call_fraction (added later) written out at its default: the same keys
    assert warm_start_key(load_config(None, [*calculator, "sft.tool_call_fraction=1.0"])) == "fd049aab88e0"
    assert warm_start_key(load_config(None, ["sft.tool_call_fraction=1.0"])) == "29e4437d1ea3"


SHAPE = ["sft.hidden_size=64", "sft.num_layers=2", "sft.num_heads=2", "sft.num_kv_heads=1", "sft.intermediate_size=96"]
SHAPE_KEYS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size")


def test_the_shape_fields_at_their_defaults_keep_every_key_and_a_changed_shape_changes_it() -> None:
    """``sft.hidden_size`` ... (added after the keys above): written out at the defaults, the keys pinned above
    stay; each changed one gives a new key (a cache of another shape is never reused)."""
    defaults = TinyModelSpec()
    at_defaults = [f"sft.{name}={getattr(defaults, name)}" for name in SHAPE_KEYS]
    assert warm_start_key(load_config(None, at_defaults)) == "29e4437d1ea3"
    assert tiny_spec(load_config(None, []).sft) == defaults
    base = warm_start_key(load_config(None, CALC))
    keys = {warm_start_key(load_config(None, [*CALC, change])) for change in SHAPE}
    assert base not in keys and len(keys) == len(SHAPE)


def test_the_warm_start_builds_the_shape_of_the_config(tmp_path) -> None:
    cfg = load_config(
        None,
        [
            *CALC,
            *SHAPE,
            "task.train_size=8",
            "sft.steps=1",
            "sft.batch_size=4",
            "sft.warmup_steps=1",
            f"sft.cache_dir={tmp_path}",
            "run.progress=false",
        ],
    )
    built = ensure_policy(cfg)
    model, _ = load_policy(built, device="cpu", dtype="float32")
    c = model.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size) == (
        64,
        2,
        2,
        1,
        96,
    )
    assert json.loads((built / "asyncrl_tiny.json").read_text())["hidden_size"] == 64


def test_a_tiny_calculator_warm_start_is_built_then_reused(tmp_path) -> None:
    cfg = load_config(
        None,
        [
            *CALC,
            "task.train_size=8",
            "sft.steps=2",
            "sft.batch_size=4",
            "sft.warmup_steps=1",
            f"sft.cache_dir={tmp_path}",
            "run.progress=false",
        ],
    )
    built = ensure_policy(cfg)
    stats = json.loads((built / "warm_start.json").read_text())
    assert stats["sft_tokens"] > 0 and stats["sft_loss"] > 0
    stamp = (built / "warm_start.json").stat().st_mtime_ns
    assert ensure_policy(cfg) == built and (built / "warm_start.json").stat().st_mtime_ns == stamp
    load_policy(built, device="cpu", dtype="float32")


ADOPT_KEY = "06b614d3a2ec"
"""configs/calculator_adopt.yaml's warm-start key since it restarts a first stage that has not taken."""

SECOND = [
    "sft.second_stage_steps=3",
    "sft.second_stage_tool_call_fraction=0.25",
    "sft.second_stage_lr=2e-3",
    "sft.second_stage_warmup_steps=1",
]


def test_the_second_stage_enters_the_key_only_when_it_runs() -> None:
    base = warm_start_key(load_config(None, CALC))
    # without a second stage its settings at their defaults change nothing: the existing caches keep their keys
    defaults = [
        "sft.second_stage_steps=0",
        "sft.second_stage_tool_call_fraction=0.3",
        "sft.second_stage_lr=1e-3",
        "sft.second_stage_warmup_steps=10",
    ]
    assert warm_start_key(load_config(None, [*CALC, *defaults])) == base
    # configs/calculator_adopt.yaml's key, pinned: a change to the hashing would orphan its cache
    assert warm_start_key(load_config(CONFIGS / "calculator_adopt.yaml")) == (ADOPT_KEY)
    with_second = warm_start_key(load_config(None, [*CALC, *SECOND]))
    assert with_second != base
    for change in (
        "sft.second_stage_steps=4",
        "sft.second_stage_tool_call_fraction=0.5",
        "sft.second_stage_lr=1e-3",
        "sft.second_stage_warmup_steps=2",
    ):
        assert warm_start_key(load_config(None, [*CALC, *SECOND, change])) != with_second, change


def test_the_second_stage_continues_the_first_on_demonstrations_that_seldom_call(tmp_path, monkeypatch) -> None:
    """``run_warm_start`` with ``sft.second_stage_steps``: the first stage's settings and demonstrations (every one
    calls), then the second's on the same policy (its steps, lr and warm-up; a quarter call); both stages'
    statistics in ``warm_start.json``."""
    from asyncrl.launch import warm_start

    calls: list[tuple[int, float, int, float]] = []

    def fake_sft_train(model, examples, cfg, **_kwargs):  # the seam: what each stage trains on
        calling = sum("<calc>" in tokenizer.decode([t for t, m in zip(*ex, strict=True) if m]) for ex in examples)
        calls.append((cfg.steps, cfg.lr, cfg.warmup_steps, calling / len(examples)))
        return {"sft_loss": float(len(calls)), "sft_tokens": 10.0, "sft_wall_s": 0.1}

    cfg = load_config(
        None,
        [
            *CALC,
            *SHAPE,
            *SECOND,
            "task.train_size=400",
            "sft.steps=5",
            "sft.lr=3e-3",
            "sft.warmup_steps=2",
            "run.progress=false",
        ],
    )
    monkeypatch.setattr(warm_start, "sft_train", fake_sft_train)
    from asyncrl.models import build_tiny_policy

    build_tiny_policy(tmp_path / "probe", tiny_spec(cfg.sft))
    _, tokenizer = load_policy(tmp_path / "probe", device="cpu", dtype="float32")
    stats = warm_start.run_warm_start(cfg, tmp_path / "ws")
    assert [c[:3] for c in calls] == [(5, 3e-3, 2), (3, 2e-3, 1)]
    assert calls[0][3] == 1.0 and 0.15 < calls[1][3] < 0.35
    written = json.loads((tmp_path / "ws" / "warm_start.json").read_text())
    assert written == stats and stats["sft_loss"] == 1.0 and stats["second_stage_sft_loss"] == 2.0


def test_without_a_second_stage_one_stage_runs(tmp_path, monkeypatch) -> None:
    from asyncrl.launch import warm_start

    stages: list[int] = []
    monkeypatch.setattr(warm_start, "sft_train", lambda model, examples, cfg, **_: stages.append(cfg.steps) or {})
    warm_start.run_warm_start(load_config(None, [*CALC, *SHAPE, "sft.steps=5", "run.progress=false"]), tmp_path)
    assert stages == [5]


RESTART = ["sft.restart_check_step=4", "sft.restart_loss_above=0.5", "sft.max_restarts=2"]
"""A check step past the second stage's 3 steps (``SECOND``): the second stage runs without the check."""


def test_the_restart_settings_enter_the_key_only_when_on_and_are_refused_without_it() -> None:
    base = warm_start_key(load_config(None, CALC))
    defaults = ["sft.restart_check_step=0", "sft.restart_loss_above=0.5", "sft.max_restarts=2"]
    assert warm_start_key(load_config(None, [*CALC, *defaults])) == base
    with_restart = warm_start_key(load_config(None, [*CALC, *RESTART]))
    assert with_restart != base
    for change in ("sft.restart_check_step=3", "sft.restart_loss_above=0.4", "sft.max_restarts=1"):
        assert warm_start_key(load_config(None, [*CALC, *RESTART, change])) != with_restart, change
    with pytest.raises(ConfigError, match="sft.restart_loss_above set without sft.restart_check_step"):
        load_config(None, [*CALC, "sft.restart_loss_above=0.3"])
    for past_the_last_check in (5, 6):  # the check runs before a step: at step 5 of 5 it would never run
        with pytest.raises(ConfigError, match="sft.restart_check_step must be below sft.steps"):
            load_config(None, [*CALC, "sft.steps=5", f"sft.restart_check_step={past_the_last_check}"])
    load_config(None, [*CALC, "sft.steps=5", "sft.restart_check_step=4"])
    for bad in ("sft.restart_check_step=-1", "sft.restart_loss_above=0", "sft.max_restarts=0"):
        with pytest.raises(ConfigError, match=f"{bad.split('=')[0]} must be"):
            load_config(None, [*CALC, "sft.restart_check_step=2", bad])


@pytest.mark.parametrize("failures, kept", [(0, 0), (1, 1), (2, 2), (5, 2)])
def test_a_stage_that_has_not_taken_is_built_again_with_the_next_seed(tmp_path, monkeypatch, failures, kept) -> None:
    """``sft.restart_check_step``: each abandoned attempt builds the policy again and runs the stage with the seed
    1000 further; the last allowed attempt runs without the check; the second stage continues the kept seed."""
    from asyncrl.launch import warm_start

    attempts: list[tuple[int, int, tuple[int, float] | None]] = []
    builds: list[Path] = []

    def fake_sft_train(model, examples, cfg, *, abandon_above=None, **_kwargs):
        attempts.append((cfg.steps, cfg.seed, abandon_above))
        if abandon_above and len(attempts) <= failures:
            return {"sft_loss": 0.9, "sft_tokens": 1.0, "sft_wall_s": 0.1, "sft_abandoned_at": 4.0}
        return {"sft_loss": 0.05, "sft_tokens": 1.0, "sft_wall_s": 0.1}

    real_build = warm_start.build_tiny_policy
    monkeypatch.setattr(warm_start, "build_tiny_policy", lambda out, spec: builds.append(out) or real_build(out, spec))
    monkeypatch.setattr(warm_start, "sft_train", fake_sft_train)
    cfg = load_config(
        None,
        [*CALC, *SHAPE, *RESTART, *SECOND, "task.train_size=100", "sft.steps=5", "sft.seed=7", "run.progress=false"],
    )
    stats = warm_start.run_warm_start(cfg, tmp_path / "ws")
    first_stage = [a for a in attempts if a[0] == 5]
    assert [a[1] for a in first_stage] == [7 + 1000 * k for k in range(kept + 1)]
    assert [a[2] for a in first_stage] == [(4, 0.5)] * min(kept + 1, 2) + [None] * (kept + 1 - min(kept + 1, 2))
    assert len(builds) == kept + 1
    assert attempts[-1] == (3, 7 + 1000 * kept, None)  # the second stage, on the kept seed's policy
    assert stats["sft_restarts"] == kept and stats["sft_seed"] == 7 + 1000 * kept
    assert stats["sft_abandoned_steps"] == 4 * min(failures, 2) and stats["sft_loss"] == 0.05
    assert stats["sft_abandoned_wall_s"] == pytest.approx(0.1 * min(failures, 2))


def test_examples_are_built_from_inside_a_running_event_loop(tiny_policy_dir) -> None:
    """``asyncrl train`` builds a missing warm start from inside its event loop (``launch.local._train_async``):
    the environment's resets then run in a loop of their own, and the examples are the same as outside one."""
    import asyncio

    _, tokenizer = load_policy(tiny_policy_dir, device="cpu", dtype="float32")
    cfg = load_config(None, [*CALC, "task.train_size=16"])

    async def inside() -> list:
        return warm_start_examples(cfg, tokenizer)

    assert asyncio.run(inside()) == warm_start_examples(cfg, tokenizer)


def test_stop_below_loss_ends_the_first_stage_only_and_enters_the_key_when_set(tmp_path, monkeypatch) -> None:
    """``sft.stop_below_loss``: passed to the first stage, never to the second (which continues the first and runs
    its steps); hashed into the warm-start key only when set, so existing caches keep theirs; below 0 refused."""
    from asyncrl.launch import warm_start

    base = warm_start_key(load_config(None, CALC))
    assert warm_start_key(load_config(None, [*CALC, "sft.stop_below_loss=0"])) == base
    assert warm_start_key(load_config(None, [*CALC, "sft.stop_below_loss=0.1"])) != base
    with pytest.raises(ConfigError, match="sft.stop_below_loss must be"):
        load_config(None, [*CALC, "sft.stop_below_loss=-0.1"])
    bars: list[float] = []

    def fake_sft_train(model, examples, cfg, *, stop_below=0.0, **_kwargs):
        bars.append(stop_below)
        return {"sft_loss": 0.05, "sft_tokens": 1.0, "sft_wall_s": 0.1}

    monkeypatch.setattr(warm_start, "sft_train", fake_sft_train)
    cfg = load_config(None, [*CALC, *SHAPE, *SECOND, "sft.steps=5", "sft.stop_below_loss=0.1", "run.progress=false"])
    warm_start.run_warm_start(cfg, tmp_path / "ws")
    assert bars == [0.1, 0.0]
