"""DESIGN §4.8 token-exact trajectories: the ids trained are the ids the engine was given or produced,
across every turn; at η = 0 the trainer's log-probs of the model tokens equal the engine's.

The suite: three chat templates (the tiny model's, a Qwen2.5-style and a Llama-3.1-style one with
tool calling, built locally in ``tests/rollout/chat_templates.py``), each with its call format, x
scripted multi-turn traces (tool call then answer; a malformed call, an unknown tool and two calls
in one turn; weight updates that abort turns; non-canonical model tokens that a re-tokenisation would
change; turn and token budgets; a turn stopped at the ``</tool_call>`` token). Every trace must show
zero mismatches between the trajectory's ids and the engine's inputs and outputs, a loss mask exactly
on the tokens the engine produced, and the engine's behaviour log-probs and versions on them. Then
the tiny model on the real ``LocalEngine``, with a weight update landing inside an episode: the same
exactness, and the trainer's recomputed log-probs of every model token within 1e-4 of the engine's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from asyncrl.config import AlgoConfig, TrainerConfig
from asyncrl.controller.buffer import groups_to_samples
from asyncrl.models import build_tiny_policy, load_policy
from asyncrl.rollout.agent import AgentSettings, AgentWorkflow, run_agent_episode
from asyncrl.rollout.chat import ChatRenderer
from asyncrl.rollout.envs.calculator import calculator_env
from asyncrl.rollout.envs.gym import GymAdapter
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.tools import ToolFormat
from asyncrl.types import EnvSegment, Prompt, Trajectory, WeightUpdate
from tests.rollout.chat_templates import llama_tokenizer, qwen_tokenizer, tiny_tokenizer
from tests.rollout.scripted_engine import ScriptedEngine, Turn, exactness

TOL = 1e-4
SEED = 7


@dataclass
class Kit:
    """A template with its tokenizer, call format and end-of-turn tokens."""

    name: str
    tok: Any
    fmt: ToolFormat
    eot: tuple[int, ...]
    """End-of-turn tokens; the first is what the template writes, the last what the model samples."""

    def call(self, expr: str, name: str = "calculator") -> str:
        match self.fmt:
            case "tag":
                return f"<calc>{expr}</calc>"
            case "hermes":
                return f'<tool_call>\n{{"name": "{name}", "arguments": {{"expression": "{expr}"}}}}\n</tool_call>'
            case "json":
                return f'{{"name": "{name}", "parameters": {{"expression": "{expr}"}}}}'

    def malformed(self) -> str:
        return {
            "tag": "<calc>12*3",
            "hermes": "<tool_call>\n{name: calculator}\n</tool_call>",
            "json": '{"name": "calculator", "parameters": ',
        }[self.fmt]

    def ids(self, text: str, *, per_char: bool = False, end: bool = True) -> tuple[int, ...]:
        """Model tokens for ``text``: canonical, or one encode per character (what a sampler may pick
        and a re-tokenisation would merge), closed by the end-of-turn token."""
        if per_char:
            body = tuple(t for ch in text for t in self.tok.encode(ch, add_special_tokens=False))
        else:
            body = tuple(self.tok.encode(text, add_special_tokens=False))
        return body + ((self.eot[-1],) if end else ())

    def renderer(self) -> ChatRenderer:
        return ChatRenderer(self.tok, self.eot)


@pytest.fixture(scope="module")
def kits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Kit]:
    tiny = tiny_tokenizer(tmp_path_factory.mktemp("tiny_tok"))
    qwen, llama = qwen_tokenizer(), llama_tokenizer()
    ids = lambda tok, *names: tuple(tok.convert_tokens_to_ids(n) for n in names)  # noqa: E731
    return {
        "tiny": Kit("tiny", tiny, "tag", (tiny.eos_token_id,)),
        "qwen2.5": Kit("qwen2.5", qwen, "hermes", ids(qwen, "<|im_end|>")),
        "llama3.1": Kit("llama3.1", llama, "json", ids(llama, "<|eot_id|>", "<|eom_id|>")),
    }


PROMPT = Prompt("p0", (), answer="18272727", meta={"question": "What is 48213*379?"})


def _run(kit: Kit, turns: list[Turn], settings: AgentSettings | None = None) -> tuple[Trajectory, ScriptedEngine]:
    engine = ScriptedEngine({SEED: turns})
    settings = settings or AgentSettings(tool_format=kit.fmt, max_turns=6, max_tokens=2000)
    sampling = SamplingParams(max_new_tokens=200, seed=SEED, stop_token_ids=kit.eot)

    async def go() -> Trajectory:
        env = calculator_env()
        try:
            return await run_agent_episode(engine, env, kit.renderer(), PROMPT, sampling, settings)
        finally:
            await env.close()

    return asyncio.run(asyncio.wait_for(go(), 30)), engine


def _assert_exact(traj: Trajectory, engine: ScriptedEngine) -> None:
    report = exactness(traj, engine.calls)
    assert report["engine_tokens"] == sum(traj.loss_mask) > 0
    assert {k: v for k, v in report.items() if k != "engine_tokens"} == {
        "mismatches": 0,
        "mask_errors": 0,
        "logprob_errors": 0,
        "version_errors": 0,
    }
    # each engine call was given exactly the trajectory so far
    assert all(traj.token_ids[: len(c.input_ids)] == c.input_ids for c in engine.calls)


def _decode(kit: Kit, ids: tuple[int, ...]) -> str:
    return kit.tok.decode(list(ids), skip_special_tokens=False)


# ------------------------------------------------------------------------------- the traces
def trace_call_then_answer(kit: Kit) -> None:
    traj, engine = _run(kit, [Turn(kit.ids(kit.call("48213*379"))), Turn(kit.ids("#18272727"))])
    _assert_exact(traj, engine)
    assert traj.end == "answer" and traj.env_reward == 1.0
    assert [type(s).__name__ for s in traj.segments] == ["ModelSegment", "EnvSegment", "ModelSegment"]
    assert "18272727" in _decode(kit, traj.segments[1].token_ids)
    assert traj.turns[0].tool_calls == ("calculator",) and traj.turns[0].env_tokens == len(traj.segments[1].token_ids)


def trace_malformed_unknown_and_two_calls(kit: Kit) -> None:
    """A malformed call, a failing one, two calls in one turn (one in the json format), the answer."""
    two = kit.call("2+3") + ("\n" + kit.call("4*5") if kit.fmt != "json" else "")
    turns = [
        Turn(kit.ids(kit.malformed())),
        Turn(kit.ids(kit.call("1/0") if kit.fmt == "tag" else kit.call("1+1", name="weather"))),
        Turn(kit.ids(two)),
        Turn(kit.ids("#18272727")),
    ]
    traj, engine = _run(kit, turns)
    _assert_exact(traj, engine)
    malformed, unknown, calls, answer = traj.turns
    assert malformed.malformed == 1 and traj.segments[1].kind == "error"
    assert "error:" in _decode(kit, traj.segments[1].token_ids)
    assert unknown.tool_errors == 1  # an unknown tool (the tag format has no names: a failing call)
    failure = "division by zero" if kit.fmt == "tag" else "unknown tool 'weather'"
    assert failure in _decode(kit, traj.segments[3].token_ids)
    assert calls.tool_calls == (("calculator",) * (1 if kit.fmt == "json" else 2))
    env_text = _decode(kit, traj.segments[5].token_ids)
    assert "5" in env_text and (kit.fmt == "json" or "20" in env_text)
    assert traj.end == "answer" and traj.env_reward == 1.0 and len(engine.calls) == 4


def trace_interrupted_turns(kit: Kit) -> None:
    call = kit.ids(kit.call("48213*379"))
    n = len(call)
    versions = tuple(0 if i < 2 else 1 if i < 5 else 2 for i in range(n))
    traj, engine = _run(kit, [Turn(call, versions, abort_after=(2, 5)), Turn(kit.ids("#18272727"), 3, (1,))])
    _assert_exact(traj, engine)
    assert len(engine.calls) == 5  # two aborts in turn 1, one in turn 2
    assert traj.turns[0].num_interruptions == 2 and traj.turns[1].num_interruptions == 1
    assert (traj.min_version, traj.max_version) == (0, 3)  # staleness: the oldest model token
    assert traj.segments[0].versions == versions
    assert (traj.turns[0].min_version, traj.turns[0].max_version, traj.turns[1].min_version) == (0, 2, 3)
    assert traj.to_completion().min_version == 0 and traj.env_reward == 1.0


def trace_non_canonical_tokens(kit: Kit) -> None:
    """The model sampled a tokenisation that encode(decode(...)) would change: kept as sampled."""
    turns = [Turn(kit.ids(kit.call("48213*379"), per_char=True)), Turn(kit.ids("#18272727 ok", per_char=True))]
    traj, engine = _run(kit, turns)
    _assert_exact(traj, engine)
    assert traj.segments[0].token_ids == turns[0].ids and traj.env_reward == 1.0
    if kit.name != "tiny":  # BPE: a re-tokenised conversation would not be the sequence the engine saw
        text = _decode(kit, traj.token_ids)
        assert tuple(kit.tok.encode(text, add_special_tokens=False)) != traj.token_ids


def trace_budgets(kit: Kit) -> None:
    calls = [Turn(kit.ids(kit.call(f"{i}*{i}"))) for i in range(1, 5)]
    traj, engine = _run(kit, calls, AgentSettings(tool_format=kit.fmt, max_turns=2, max_tokens=2000))
    _assert_exact(traj, engine)
    assert traj.end == "max_turns" and len(traj.turns) == 2 and traj.env_reward == 0.0
    assert not isinstance(traj.segments[-1], EnvSegment)  # no trailing environment tokens
    first = len(calls[0].ids)
    traj, engine = _run(kit, calls, AgentSettings(tool_format=kit.fmt, max_turns=6, max_tokens=first + 3))
    _assert_exact(traj, engine)
    assert traj.end == "max_tokens" and len(traj.response_ids) <= first + 3
    traj, engine = _run(kit, calls, AgentSettings(tool_format=kit.fmt, max_turn_tokens=first - 1))
    _assert_exact(traj, engine)
    assert traj.end == "length" and traj.segments[0].finish_reason == "length" and len(traj.segments) == 1


TRACES: dict[str, Callable[[Kit], None]] = {
    "call_then_answer": trace_call_then_answer,
    "malformed_unknown_two_calls": trace_malformed_unknown_and_two_calls,
    "interrupted": trace_interrupted_turns,
    "non_canonical": trace_non_canonical_tokens,
    "budgets": trace_budgets,
}


@pytest.mark.parametrize("trace", sorted(TRACES))
@pytest.mark.parametrize("template", ["tiny", "qwen2.5", "llama3.1"])
def test_trace_is_token_exact(kits: dict[str, Kit], template: str, trace: str) -> None:
    TRACES[trace](kits[template])


def test_turn_stopped_at_the_tool_call_close_token(kits: dict[str, Kit]) -> None:
    """Qwen's ``</tool_call>`` is one token: the turn stops there and the template's glue closes it."""
    kit = kits["qwen2.5"]
    close = kit.tok.convert_tokens_to_ids("</tool_call>")
    call = kit.ids(kit.call("48213*379"), end=False)
    assert call[-1] == close
    settings = AgentSettings(tool_format="hermes", stop_at_tool_close=True, max_tokens=2000)
    traj, engine = _run(kit, [Turn(call), Turn(kit.ids("#18272727"))], settings)
    _assert_exact(traj, engine)
    assert close in engine.calls[0].sampling.stop_token_ids
    assert _decode(kit, traj.segments[1].token_ids).startswith("<|im_end|>\n<|im_start|>user\n<tool_response>")
    assert traj.env_reward == 1.0


# ------------------------------------------------------------------------- the real engine
class _Echo:
    """A text gym that answers every turn, for four turns (a random-init model calls no tool)."""

    def __init__(self) -> None:
        self.turns = 0

    def reset(self, prompt: Prompt) -> str:
        return "12+34"

    def step(self, action: str) -> tuple[str, float, bool]:
        self.turns += 1
        return f"{self.turns * 7}", 0.5, self.turns >= 4


class _Recording:
    """Wraps an engine and records its generate calls (for ``exactness``)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.calls: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def generate(self, input_ids: Any, sampling: SamplingParams, n: int = 1, on_sample_done: Any = None) -> Any:
        from tests.rollout.scripted_engine import Call

        out = await self.engine.generate(input_ids, sampling, n, on_sample_done=on_sample_done)
        self.calls += [Call(tuple(input_ids), sampling, c) for c in out]
        return out


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_tiny_policy(tmp_path_factory.mktemp("tiny_token_exact"))


@pytest.mark.parametrize("prefix_reuse", [False, True])
def test_local_engine_episodes_are_exact_and_match_the_trainer(tiny_dir: Any, prefix_reuse: bool) -> None:
    """η = 0 (weights never change; one update republishes them): exact ids, and trainer log-probs
    of every model token equal the engine's behaviour log-probs to 1e-4, across turns; with prefix
    reuse the later turns prefill only their new tokens (until the update drops the retained KV)."""
    from asyncrl.rollout.engine import LocalEngine
    from asyncrl.trainer.trainer import Trainer

    model, tok = load_policy(tiny_dir)
    ref, _ = load_policy(tiny_dir)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    engine = LocalEngine(model, tok, max_slots=8, max_seq_len=512, prefix_reuse=prefix_reuse)
    rec = _Recording(engine)
    # short turns from a random model: a few frequent characters also end a turn
    stops = (tok.eos_token_id, *tok.convert_tokens_to_ids(list("aeiou")))
    settings = AgentSettings(tool_format="tag", max_turns=4, max_tokens=300, max_turn_tokens=60)
    workflow = AgentWorkflow(tok, lambda: GymAdapter(_Echo(), role="tool"), settings, end_of_turn_ids=stops)
    prompt = Prompt("g0", (), answer="", meta={"question": "12+34"})
    sampling = SamplingParams(max_new_tokens=60, temperature=1.0, seed=3, stop_token_ids=stops)

    async def score(p: Prompt, c: Any) -> tuple[float, str | None]:
        raise AssertionError("the gym adapter scores its episodes")

    async def go() -> Any:
        task = asyncio.create_task(workflow(rec, prompt, sampling, 3, score, start_version=0))
        while engine.stats()["decode_steps"] < 12 and not task.done():
            await asyncio.sleep(0.001)
        await engine.update_weights(WeightUpdate(version=1, tensors={k: v.clone() for k, v in state.items()}))
        return await task

    try:
        group = asyncio.run(asyncio.wait_for(go(), 120))
        stats = engine.stats()
    finally:
        engine.close()
    assert (stats["prefix_hits"] > 0) == prefix_reuse  # later turns reused the conversation's KV
    for i, traj in enumerate(group.trajectories):
        own = [c for c in rec.calls if c.sampling.seed == (3 + i)]
        _assert_exact(traj, _as_engine(own))
        assert len(traj.turns) >= 2 and any(isinstance(s, EnvSegment) for s in traj.segments)
    assert {v for t in group.trajectories for v in t.versions if v >= 0} <= {0, 1}
    samples = groups_to_samples([group], AlgoConfig())
    trainer = Trainer(ref, TrainerConfig(max_tokens_per_micro_batch=256), AlgoConfig(), temperature=1.0)
    worst = 0.0
    for s, logp in zip(samples, trainer.compute_logprobs(samples), strict=True):
        mask = torch.tensor(s.loss_mask, dtype=torch.bool)
        diff = (logp.float().cpu()[mask] - torch.tensor(s.behav_logprobs)[mask]).abs().max().item()
        worst = max(worst, diff)
    assert worst <= TOL, f"trainer vs engine log-prob max abs diff {worst:.2e} over multi-turn samples"
    assert all(r in (0.0, 0.5, 1.0, 1.5, 2.0) for r in group.rewards)  # the gym's step rewards, summed


def _as_engine(calls: list[Any]) -> ScriptedEngine:
    engine = ScriptedEngine({})
    engine.calls = list(calls)
    return engine
