"""What to simulate: devices, the controller's admission settings, the workload, the cost profile.

Owns ``Scenario`` (one flat typed dataclass, so that ``--set key=value`` reaches every field), its
validation, reading it from YAML and overrides, and building it from a training config or from a
real run's directory (its ``config.yaml`` and ledger), so that a simulated run and a real one can be
compared setting for setting. The controller fields keep the names of ``controller.*`` and
``rollout.*`` in the config tree and mean the same thing.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

from asyncrl.choices import HighWaterUnit, InterruptMode, StragglerPolicy, WeightSyncMode, check_choice
from asyncrl.config import Config, load_config
from asyncrl.sim.workload import FINISHED, LengthKind, ledger_path

SampleReports = Literal["auto", "yes", "no"]
"""``Scenario.sample_reports``: whether the controller hears of each sample's end."""


@dataclass(frozen=True)
class Scenario:
    profile: str = "cpu-2core-tiny"
    """A cost profile: a JSON file or the name of a shipped one (``sim.profile.builtin_profiles``)."""
    # ---- devices
    engines: int = 1
    """Rollout engine instances (each takes the profile's ``engine.devices`` devices)."""
    slots: int = 0
    """Decode slots per engine (``rollout.max_slots``); 0: the profile's ``engine.max_slots``."""
    trainer_ranks: int = 1
    """Data-parallel trainer ranks (``launch.trainer_ranks``)."""
    gpus: int = 0
    """When > 0: a device budget split into engines and trainer ranks by ``inference_fraction``
    (overrides ``engines`` and ``trainer_ranks``)."""
    inference_fraction: float = 0.75
    # ---- the controller (same meaning as controller.* / rollout.*)
    batch_size: int = 16
    group_size: int = 8
    max_staleness: int = 4
    max_concurrent: int = 64
    high_water_batches: int = 2
    high_water_unit: HighWaterUnit = "groups"
    stragglers: StragglerPolicy = "drop"
    """``controller.stragglers``: drop a group finished past its bound, or batch the groups due soonest and
    hold the trainer while a running group must be in this batch to be trained in time
    (``controller.staleness.must_wait_for_stragglers``)."""
    adaptive: bool = False
    """``controller.adaptive``: the controller's own policy (``controller.adaptive.AdaptiveAdmission``)
    sets η_t <= max_staleness and the mark after every simulated step from the simulated trainer wait
    and slot occupancy (a simulation trains no policy: no off-policy statistics, so that rule never fires);
    high_water_batches is then not used."""
    weight_sync: WeightSyncMode = "inflight"
    interrupt_mode: InterruptMode = "abort"
    total_steps: int = 100
    filter_prob: float = 0.0
    """Probability that a finished group is rejected by the filter (dynamic sampling: all rewards
    equal); its samples cost generation and train nothing."""
    ledger_filter: bool = False
    """lengths=ledger: a replayed group is rejected by the filter exactly when the ledger's run
    rejected it (its fate travels with its lengths, so the filter keeps its dependence on them:
    ``sim.workload``); ``filter_prob`` is then not used. ``from_run`` sets it."""
    ledger_ordered: bool = False
    """lengths=ledger: hand out the ledger's groups in the order its run admitted them, each once,
    before drawing (``sim.workload``): a simulation of that run meets its own sequence of prompts.
    ``from_run`` sets it."""
    sample_reports: SampleReports = "auto"
    """Whether the controller learns of each sample's end (``yes``: as from one ``LocalEngine``) or
    only of the group's (``no``: as through ``EnginePool``); ``auto``: ``yes`` with one engine."""
    # ---- workload
    lengths: LengthKind = "lognormal"
    """constant | lognormal | ledger (``sim.workload``)."""
    length_median: float = 200.0
    length_sigma: float = 1.0
    length_within_sigma: float = 0.3
    ledger: str = ""
    """lengths=ledger: a run directory or its trajectories.jsonl."""
    max_new_tokens: int = 2048
    prompt_len: int = 100
    reward_latency_s: float = -1.0
    """Seconds from a group's last sample to its rewards; < 0: the profile's."""
    # ---- output
    seed: int = 0
    warmup_steps: int = -1
    """The steady-state window opens at the end of this step (< 0: a tenth of total_steps)."""
    timeline_lines: int = 4000
    """Most timeline samples kept (the sampling period doubles until they fit)."""
    timeline_period_s: float = 0.25
    """Starting timeline period (``controller.loop`` samples every 0.25 s)."""
    ledger_rows: int = 200_000
    """Write the per-sample ledger when the run has at most this many samples (else none)."""

    def __post_init__(self) -> None:
        check_scenario(self)

    def resolved(self, engine_devices: int, rank_devices: int, profile_slots: int) -> Scenario:
        """Engines, ranks and slots made explicit from ``gpus`` and the profile."""
        out = self
        if self.gpus > 0:
            inference = int(self.gpus * self.inference_fraction)
            engines = max(1, inference // engine_devices)
            ranks = max(1, (self.gpus - engines * engine_devices) // rank_devices)
            out = replace(out, engines=engines, trainer_ranks=ranks)
        if out.slots <= 0:
            out = replace(out, slots=profile_slots)
        return out

    @property
    def per_sample_reports(self) -> bool:
        return self.sample_reports == "yes" or (self.sample_reports == "auto" and self.engines == 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_scenario(s: Scenario) -> None:
    """Raises ``ValueError`` naming the first setting that cannot be simulated."""
    choices = {
        "high_water_unit": (s.high_water_unit, HighWaterUnit),
        "weight_sync": (s.weight_sync, WeightSyncMode),
        "interrupt_mode": (s.interrupt_mode, InterruptMode),
        "lengths": (s.lengths, LengthKind),
        "stragglers": (s.stragglers, StragglerPolicy),
        "sample_reports": (s.sample_reports, SampleReports),
    }
    for key, (value, alias) in choices.items():
        check_choice(value, alias, f"scenario.{key}")
    positive = (
        "engines",
        "trainer_ranks",
        "batch_size",
        "group_size",
        "max_concurrent",
        "total_steps",
        "max_new_tokens",
        "prompt_len",
        "timeline_lines",
    )
    for key in positive:
        if getattr(s, key) < 1:
            raise ValueError(f"scenario.{key} must be >= 1, got {getattr(s, key)}")
    if s.max_staleness < 0 or s.high_water_batches < 0 or s.slots < 0 or s.gpus < 0 or s.ledger_rows < 0:
        raise ValueError("scenario: max_staleness, high_water_batches, slots, gpus, ledger_rows must be >= 0")
    if not 0.0 <= s.filter_prob < 1.0 or not 0.0 < s.inference_fraction < 1.0 or s.timeline_period_s <= 0:
        raise ValueError("scenario: filter_prob in [0, 1), inference_fraction in (0, 1), timeline_period_s > 0")
    if (s.ledger_filter or s.ledger_ordered) and s.lengths != "ledger":
        raise ValueError("scenario.ledger_filter and ledger_ordered replay a ledger: they need lengths=ledger")
    if s.lengths == "ledger" and not s.ledger:
        raise ValueError("scenario: lengths=ledger needs ledger=RUN_DIR (or its trajectories.jsonl)")


def _parse(field_type: str, text: str) -> Any:
    match field_type:
        case "int":
            return int(text)
        case "float":
            return float(text)
        case "bool":
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"not a boolean: {text!r} (true or false)")
            return text.lower() in ("true", "1", "yes")
        case _:
            return text


def with_overrides(base: Scenario, overrides: dict[str, Any] | list[str] | tuple[str, ...]) -> Scenario:
    """``base`` with ``key=value`` strings (or a mapping) applied; unknown keys name the valid ones."""
    types = {f.name: str(f.type) for f in fields(Scenario)}
    items: dict[str, Any] = {}
    pairs = overrides.items() if isinstance(overrides, dict) else [_split(o) for o in overrides]
    for key, value in pairs:
        if key not in types:
            raise ValueError(f"unknown scenario key {key!r} (valid: {', '.join(sorted(types))})")
        items[key] = _parse(types[key], value) if isinstance(value, str) else value
    return replace(base, **items)


def _split(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"override {text!r} is not key=value")
    return key.strip(), value.strip()


def load_scenario(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
    """Defaults, then a YAML/JSON file of scenario keys, then ``key=value`` overrides."""
    base = Scenario()
    if path is not None:
        import yaml

        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a scenario file holds a mapping of scenario keys")
        base = with_overrides(base, data)
    return with_overrides(base, list(overrides))


def from_config(cfg: Config, **extra: Any) -> Scenario:
    """The scenario of a training config: controller and rollout settings taken as they are."""
    c, r = cfg.controller, cfg.rollout
    if c.fixed_lag is not None:
        raise ValueError("controller.fixed_lag is not simulated (it is a synchronous loop with lagged weights)")
    engines = r.num_engines if cfg.launch.kind == "ray" else 1
    base = Scenario(
        engines=engines,
        slots=r.max_slots,
        trainer_ranks=cfg.launch.trainer_ranks,
        batch_size=c.batch_size,
        group_size=r.group_size,
        max_staleness=c.max_staleness,
        max_concurrent=c.max_concurrent,
        high_water_batches=c.high_water_batches,
        high_water_unit=c.high_water_unit,
        adaptive=c.adaptive,
        weight_sync=c.weight_sync,
        stragglers=c.stragglers,
        interrupt_mode=r.interrupt_mode,
        total_steps=c.total_steps,
        max_new_tokens=r.max_new_tokens,
    )
    return with_overrides(base, extra)


def from_run(run_dir: str | Path, **extra: Any) -> Scenario:
    """The scenario of a finished run: its config, its ledger's lengths replayed, its filter rate
    and mean prompt length measured (``extra`` on top, e.g. ``profile``)."""
    run = Path(run_dir)
    cfg = load_config(run / "config.yaml")
    stats = run_workload(run)
    replay = {"lengths": "ledger", "ledger": str(ledger_path(run)), "ledger_filter": True, "ledger_ordered": True}
    measured = {**replay, **stats}
    if cfg.controller.max_rl_time_s and (metrics := run / "metrics.jsonl").is_file():
        # a run its time budget ended trained fewer steps than its cap: simulate the steps it trained
        trained_steps = sum(1 for line in metrics.read_text().splitlines() if line.strip())
        measured["total_steps"] = max(1, min(cfg.controller.total_steps, trained_steps))
    return from_config(cfg, **{**measured, **extra})


def run_workload(run_dir: str | Path) -> dict[str, Any]:
    """``filter_prob`` (filtered groups / finished groups) and ``prompt_len`` (trained tokens not
    accounted for by trained responses, per trained sample) of a run directory."""
    run = Path(run_dir)
    rows = [json.loads(x) for x in ledger_path(run).read_text().splitlines() if x.strip()]
    done = [r for r in rows if r.get("status") in FINISHED and r.get("sample_idx") is not None]
    groups: dict[tuple[str, str], str] = {}
    for r in done:
        groups[(r["prompt_id"], str(r.get("start_version")))] = r["status"]
    filtered = sum(1 for s in groups.values() if s == "filtered")
    out: dict[str, Any] = {"filter_prob": filtered / len(groups) if groups else 0.0}
    trained = [r for r in done if r["status"] == "trained"]
    metrics_path = run / "metrics.jsonl"
    if trained and metrics_path.is_file():
        metrics = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
        tokens = sum(m["trained_tokens"] for m in metrics if m.get("applied", True))
        prompt = (tokens - sum(r["response_len"] for r in trained)) / len(trained)
        out["prompt_len"] = max(1, round(prompt))
    return out
