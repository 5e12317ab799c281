"""A scripted ``RolloutEngine`` for multi-turn tests, and the token-exactness check.

``ScriptedEngine`` plays scripted model turns (token ids, versions, abort points) keyed by the
sampling seed (one script per episode), behaves like an engine at the edges (stops at the turn's
end, truncates at ``max_new_tokens`` with ``length``, returns ``abort`` chunks at scripted weight
updates and expects the resubmission to be the prompt plus the partial output), stamps a
deterministic behaviour log-prob per token, and records every call. ``exactness`` compares a
trajectory with those records position by position.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from asyncrl.rollout.api import SampleDone
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Completion, Trajectory, WeightUpdate


def fake_logprob(token: int, position: int) -> float:
    return -(((token * 31 + position * 7) % 101) + 1) / 50.0


@dataclass(frozen=True)
class Turn:
    """One scripted model turn."""

    ids: tuple[int, ...]
    version: int | tuple[int, ...] = 0
    """One version for the whole turn, or one per token (weight updates inside the turn)."""
    abort_after: tuple[int, ...] = ()
    """Token counts after which a weight update aborts the turn (the client must resume it)."""

    def versions(self) -> tuple[int, ...]:
        if isinstance(self.version, int):
            return (self.version,) * len(self.ids)
        assert len(self.version) == len(self.ids)
        return self.version


@dataclass
class Call:
    input_ids: tuple[int, ...]
    sampling: SamplingParams
    output: Completion


@dataclass
class _Cursor:
    turn: int = 0
    offset: int = 0
    expect_input: tuple[int, ...] | None = None


@dataclass
class ScriptedEngine:
    """``RolloutEngine`` over scripts (seed -> turns); see the module docstring."""

    scripts: dict[int, list[Turn]]
    calls: list[Call] = field(default_factory=list)
    delay_s: float = 0.0
    _cursors: dict[int, _Cursor] = field(default_factory=dict)

    version: int = 0
    reports_each_sample: bool = False

    def start(self) -> None:
        pass

    async def generate(
        self, input_ids: Sequence[int], sampling: SamplingParams, n: int = 1, on_sample_done: SampleDone | None = None
    ) -> list[Completion]:
        assert n == 1 and on_sample_done is None and sampling.seed is not None
        inp = tuple(int(t) for t in input_ids)
        cur = self._cursors.setdefault(sampling.seed, _Cursor())
        if cur.expect_input is not None:  # a resubmission after an abort: prompt + partial output
            assert inp == cur.expect_input, "the resubmission is not the prompt plus the partial output"
        turn = self.scripts[sampling.seed][cur.turn]
        stop = next((k for k in turn.abort_after if k > cur.offset), len(turn.ids))
        take = min(stop - cur.offset, sampling.max_new_tokens)
        out = turn.ids[cur.offset : cur.offset + take]
        versions = turn.versions()[cur.offset : cur.offset + take]
        assert not any(t in sampling.stop_token_ids for t in out[:-1]), "a real engine would have stopped earlier"
        cur.offset += take
        if cur.offset == len(turn.ids):
            reason = "stop" if out[-1] in sampling.stop_token_ids else "length"
        elif take == sampling.max_new_tokens:
            reason = "length"  # the budget cut the turn: the rest of it is never sampled
        else:
            reason = "abort"
        if reason == "abort":
            cur.expect_input = inp + out
        else:
            cur.turn, cur.offset, cur.expect_input = cur.turn + 1, 0, None
        lps = tuple(fake_logprob(t, len(inp) + i) for i, t in enumerate(out))
        c = Completion(inp, out, lps, versions, reason, num_interruptions=int(reason == "abort"))
        self.calls.append(Call(inp, sampling, c))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        await asyncio.sleep(0)
        return [c]

    async def update_weights(self, update: WeightUpdate) -> None:
        self.version = update.version

    async def pause(self) -> None:
        pass

    async def resume(self) -> None:
        pass

    async def abort_all(self) -> int:
        return 0

    def stats(self) -> dict[str, float]:
        return {"generated_tokens": float(sum(len(c.output.output_ids) for c in self.calls))}

    def close(self) -> None:
        pass


def exactness(traj: Trajectory, calls: Sequence[Call]) -> dict[str, int]:
    """Position-by-position comparison of a trajectory with the engine's calls.

    ``mismatches``: positions where the trained ids differ from what the engine was given or
    produced, plus engine inputs that are not a prefix of the trained sequence; ``mask_errors``:
    positions whose loss mask is not exactly "the engine produced this token"; ``logprob_errors`` /
    ``version_errors``: model tokens whose behaviour log-prob / version differs from the engine's."""
    ids, n_prompt = traj.token_ids, len(traj.prompt_ids)
    mask, lps, vers = traj.loss_mask, traj.behav_logprobs, traj.versions
    produced: set[int] = set()
    out = {"mismatches": 0, "mask_errors": 0, "logprob_errors": 0, "version_errors": 0, "engine_tokens": 0}
    for call in calls:
        inp, o = call.input_ids, call.output
        out["mismatches"] += sum(a != b for a, b in zip(inp, ids, strict=False)) + max(0, len(inp) - len(ids))
        for i, tok in enumerate(o.output_ids):
            pos = len(inp) + i
            out["engine_tokens"] += 1
            if pos >= len(ids) or ids[pos] != tok:
                out["mismatches"] += 1
                continue
            produced.add(pos)
            r = pos - n_prompt
            out["logprob_errors"] += lps[r] != o.behav_logprobs[i]
            out["version_errors"] += vers[r] != o.versions[i]
    out["mask_errors"] = sum((m == 1) != (n_prompt + r in produced) for r, m in enumerate(mask))
    return out
