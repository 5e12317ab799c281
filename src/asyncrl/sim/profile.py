"""Cost profiles: what one engine step, one training step, a weight sync and a reward cost.

Owns the profile schema (typed dataclasses, stored as JSON), its validation, loading (a path or the
name of a profile shipped in ``sim/profiles/``) and saving, and the cost functions the simulator
calls. Every number of a profile names where it came from in ``sources`` (measured here, published,
derived from published figures, or an assumption).

The cost model (DESIGN §6, ``docs/simulator.md``):

- one decode step of an engine with ``n`` running sequences whose contexts sum to ``ctx`` tokens::

      decode_base_s + decode_per_seq_s * n + decode_per_ctx_token_s * ctx

  (reading the weights once, the per-sequence work, reading every sequence's own K/V);
  with ``engine.slot_prefix_rows`` (``LocalEngine``), ``n`` counts rows up to the highest slot in
  use and ``ctx`` the padded attention keys (``sim.layout``);
- a prefill (a new prompt, or an aborted sample's prompt + partial output in ``abort`` mode):
  ``prefill_per_token_s`` per token;
- a weight update pauses the engine for ``update_s`` after the trainer spent ``export_s``;
- one training step over ``tokens`` trained tokens on ``ranks`` data-parallel ranks::

      base_s + per_token_s * tokens / (ranks * parallel_efficiency)   (parallel_efficiency = 1 at 1 rank)

- a group is scored ``reward.latency_s`` after its last sample ends.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
SOURCE_KINDS = ("measured", "published", "derived", "assumption")


@dataclass(frozen=True)
class EngineCost:
    """One rollout engine instance (which may span several devices: ``devices``)."""

    decode_base_s: float
    """Cost of a decode step whatever its batch (reading the weights, launching kernels)."""
    decode_per_seq_s: float
    """Added cost per running sequence of a decode step."""
    decode_per_ctx_token_s: float
    """Added cost per context token (prompt + generated) of every running sequence."""
    prefill_per_token_s: float
    """Cost of prefilling one token (a new prompt, or an aborted sample's prompt + partial output)."""
    update_s: float
    """Engine pause to load new weights."""
    max_slots: int = 128
    """Default decode slots (running sequences) when the scenario does not set them."""
    kv_capacity_tokens: int = 0
    """KV-cache capacity in tokens: a sample joins only while the running contexts plus its own
    fit (0: unlimited, the slot limit alone binds)."""
    devices: int = 1
    """Devices one engine instance occupies (tensor parallelism)."""
    slot_prefix_rows: bool = False
    """``LocalEngine``'s layout: a decode step computes every slot up to the highest one in use (idle
    rows included) and pads attention (``sim.layout``): ``decode_per_seq_s`` is then per row and
    ``decode_per_ctx_token_s`` per attention key. False: a packed batch (vLLM, SGLang), per running
    sequence and per context token."""

    def step_s(self, running: int, context_tokens: int) -> float:
        """Seconds of one decode step with ``running`` sequences holding ``context_tokens`` in all."""
        return self.decode_base_s + self.decode_per_seq_s * running + self.decode_per_ctx_token_s * context_tokens


@dataclass(frozen=True)
class TrainerCost:
    """The trainer: one data-parallel rank per ``devices_per_rank`` devices."""

    base_s: float
    """Cost of a step whatever its tokens (optimizer step, gradient all-reduce, launch)."""
    per_token_s: float
    """Cost per trained token (prompt + response) on one rank, proximal forward included."""
    parallel_efficiency: float = 1.0
    """Fraction of linear speed-up kept with more than one rank."""
    devices_per_rank: int = 1

    def step_s(self, tokens: int, ranks: int = 1) -> float:
        """Seconds of a training step over ``tokens`` trained tokens on ``ranks`` ranks."""
        eff = 1.0 if ranks <= 1 else self.parallel_efficiency
        return self.base_s + self.per_token_s * tokens / (max(1, ranks) * eff)


@dataclass(frozen=True)
class SyncCost:
    export_s: float
    """Trainer side of a weight update (gather / write / broadcast start); engines keep decoding."""


@dataclass(frozen=True)
class RewardCost:
    latency_s: float
    """From a group's last sample to its rewards (the verifiers run in parallel)."""


@dataclass(frozen=True)
class Source:
    """Where one or more numbers of a profile come from."""

    fields: str
    """The profile fields it backs (``engine.decode_*``)."""
    kind: str
    """measured | published | derived | assumption"""
    source: str
    """File, paper, page or reasoning, precise enough to check."""


@dataclass(frozen=True)
class CostProfile:
    name: str
    hardware: str
    model: str
    engine: EngineCost
    trainer: TrainerCost
    sync: SyncCost
    reward: RewardCost
    sources: tuple[Source, ...] = ()
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else worth keeping beside the numbers (the raw table a fit came from, ...)."""

    def __post_init__(self) -> None:
        check_profile(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> CostProfile:
        """A profile from its JSON form; unknown keys are an error naming the valid ones."""
        _known(data, CostProfile, "profile")
        parts = {"engine": EngineCost, "trainer": TrainerCost, "sync": SyncCost, "reward": RewardCost}
        kwargs: dict[str, Any] = {k: v for k, v in data.items() if k not in parts and k != "sources"}
        for key, cls in parts.items():
            if key not in data:
                raise ValueError(f"profile: missing section {key!r}")
            _known(data[key], cls, f"profile.{key}")
            kwargs[key] = cls(**data[key])
        sources = []
        for s in data.get("sources", []):
            _known(s, Source, "profile.sources[]")
            sources.append(Source(**s))
        kwargs["sources"] = tuple(sources)
        return CostProfile(**kwargs)


def _known(data: dict[str, Any], cls: type, where: str) -> None:
    names = {f.name for f in fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)} (valid: {sorted(names)})")


def check_profile(p: CostProfile) -> None:
    """Raises ``ValueError`` on a negative cost, a non-positive size or an unknown source kind."""
    e, t = p.engine, p.trainer
    costs = {
        "engine.decode_base_s": e.decode_base_s,
        "engine.decode_per_seq_s": e.decode_per_seq_s,
        "engine.decode_per_ctx_token_s": e.decode_per_ctx_token_s,
        "engine.prefill_per_token_s": e.prefill_per_token_s,
        "engine.update_s": e.update_s,
        "trainer.base_s": t.base_s,
        "trainer.per_token_s": t.per_token_s,
        "sync.export_s": p.sync.export_s,
        "reward.latency_s": p.reward.latency_s,
    }
    bad = [k for k, v in costs.items() if not v >= 0.0]
    if bad:
        raise ValueError(f"profile {p.name!r}: negative or missing costs {bad}")
    if e.step_s(1, 1) <= 0.0:
        raise ValueError(f"profile {p.name!r}: a decode step must cost something")
    if e.max_slots < 1 or e.devices < 1 or e.kv_capacity_tokens < 0 or t.devices_per_rank < 1:
        raise ValueError(f"profile {p.name!r}: max_slots, devices, devices_per_rank >= 1, kv_capacity_tokens >= 0")
    if not 0.0 < t.parallel_efficiency <= 1.0:
        raise ValueError(f"profile {p.name!r}: trainer.parallel_efficiency must be in (0, 1]")
    for s in p.sources:
        if s.kind not in SOURCE_KINDS:
            raise ValueError(f"profile {p.name!r}: source kind {s.kind!r} not in {SOURCE_KINDS}")


def builtin_profiles() -> list[str]:
    """Names of the profiles shipped in ``sim/profiles/``."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def load_profile(name_or_path: str | Path) -> CostProfile:
    """A profile from a JSON file, or by the name of a shipped one (``builtin_profiles()``)."""
    path = Path(name_or_path)
    if not path.is_file():
        shipped = PROFILE_DIR / f"{name_or_path}.json"
        if not shipped.is_file():
            raise FileNotFoundError(
                f"no cost profile {str(name_or_path)!r} (a JSON file, or one of: {', '.join(builtin_profiles())})"
            )
        path = shipped
    return CostProfile.from_dict(json.loads(path.read_text()))


def save_profile(profile: CostProfile, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile.to_dict(), indent=2) + "\n")
    return out
