"""AReaL's published system curves (arXiv 2505.24298) beside the simulator's: η against effective
throughput, throughput against the number of GPUs (32 -> 512), and the end-to-end step times.

Owns ``PAPER`` (the paper's numbers, each with its source, and what the paper gives no number for),
``CurvesSpec`` (what to simulate: the workload, the profiles, the η grid, the GPU counts and contexts,
the horizon), the three sweeps (``eta_points``, ``scaling_points``, ``step_time_points``: every point
one ``asyncrl simulate`` call through a ``Runner``) and ``analyse`` (sim / paper per point, whether
the η curve is monotone and where it plateaus, the scaling efficiency from the smallest to the
largest GPU count, the asynchronous speed-up). ``benchmarks/paper_report.py`` writes, prints and plots it.

Arms: ``async`` is AReaL's disaggregated loop (``inference_fraction`` of the GPUs as engines, the rest
trainer ranks, η > 0, abort mode); ``sync`` the same split at η = 0 (the paper's "synchronous AReaL");
``sync-colocated`` stands for verl (every GPU generates, then every GPU trains: ``engines`` =
``trainer_ranks`` = GPUs at η = 0, so that nothing overlaps and each phase has all the devices).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

from asyncrl.sim.output import SimResult
from asyncrl.sim.run import Simulation
from asyncrl.sim.scenario import Scenario, with_overrides

UNBOUNDED = 1_000_000
"""η standing for "unbounded": the gate's bound never binds, ``max_concurrent`` alone limits admission."""

Arm = Literal["async", "sync", "sync-colocated"]
"""How the GPUs are used (module docstring)."""

Runner = Callable[[Scenario], Simulation]
"""Simulates one scenario (``sim.run.simulate``; tests may count the calls)."""

PAPER_ID = "AReaL, arXiv 2505.24298 (Fu et al., 2025)"

PAPER: dict[str, Any] = {
    "paper": PAPER_ID,
    "eta_throughput": {
        "what": "effective training throughput (tokens consumed by training per second) against the maximum "
        "staleness eta, DeepSeek-R1-Distill-Qwen-1.5B, 512 prompts x 16 samples per step, up to 27,648 new "
        "tokens, 75% of the GPUs for inference",
        "tokens_per_s": {"0": 128.7e3, "1": 269.3e3, "2": 356.6e3, "4": 356.6e3, "8": 371.7e3, "16": 382.4e3},
        "source": "the paper's staleness ablation (Experiments section: algorithm ablations), as transcribed in "
        "the project's /work/shared/BACKGROUND.md; the paper gives accuracy, not throughput, for unbounded eta",
        "gpus": None,
        "gpus_note": "the device count of the ablation was not found in the text read here; the sweep "
        "simulates it at 128 GPUs, the 1.5B end-to-end run's 16 nodes (AReaL blog v0.3, Table 2), whose "
        "sync/async time ratio (41.0 / 14.8 h = 2.77) equals this ablation's eta = 4 ratio (356.6 / 128.7)",
    },
    "headline_speedup": {
        "value": 2.77,
        "what": "up to 2.77x training speedup against synchronous systems with the same number of GPUs",
        "source": "abstract; = 41.0 h (synchronous AReaL) / 14.8 h (AReaL), 1.5B, 1,000 PPO steps (Table 1; "
        "inclusionAI/AReaL blog/AReaL_v0_3.md Table 2: 16 nodes)",
    },
    "step_time": {
        "what": "wall time of 1,000 PPO steps, synchronous AReaL against AReaL, same nodes (H800, 8 per node)",
        "rows": [
            {"model": "1.5B", "profile": "h800-1.5b", "gpus": 128, "sync_hours": 41.0, "async_hours": 14.8},
            {"model": "7B", "profile": "h800-7b", "gpus": 192, "sync_hours": 57.7, "async_hours": 25.4},
        ],
        "source": "Table 1 of the paper (hours) and inclusionAI/AReaL blog/AReaL_v0_3.md Table 2 (hours, nodes: "
        "16 for 1.5B, 24 for 7B, 1,000 PPO steps)",
    },
    "scaling": {
        "what": "effective training throughput against the number of GPUs (strong scaling, 512 x 16 per step), "
        "AReaL against verl v0.3.0.post1, DeepSeek-R1-Distill-Qwen 1.5B / 7B / 32B",
        "claim": "near-linear scaling for AReaL; verl scales worse and runs out of memory at the longest context",
        "points": None,
        "points_note": "the per-point values are drawn in a figure (scaling_trend_vs_verl.png), not printed in any "
        "text read here: the comparison below is of shape (scaling efficiency, async / sync ratio), not of "
        "magnitude",
        "contexts": [16384, 32768],
        "contexts_note": "32,768 (31k new tokens, 1k prompt) per inclusionAI/AReaL "
        "benchmark/verl_v0_3_0_post1_312a8cb/README.md; 16,384 the figure's other context as recalled, not checked",
        "source": "the paper's strong-scaling figure (Experiments section); settings from inclusionAI/AReaL "
        "benchmark/verl_v0_3_0_post1_312a8cb/README.md and build_cmd.py (4-32 nodes of 8 GPUs, 3/4 for SGLang, "
        "max_new_tokens = context - 1024; its docstring example carries max_head_offpolicyness=4)",
    },
}


@dataclass(frozen=True)
class CurvesSpec:
    """What the sweeps simulate. ``workload`` holds scenario keys (batch, group, lengths, prompt, mode)."""

    workload: dict[str, Any]
    eta_profile: str = "h800-1.5b"
    eta_gpus: int = 128
    eta_max_new_tokens: int = 27648
    etas: tuple[int, ...] = (0, 1, 2, 4, 8, 16, UNBOUNDED)
    scaling_profiles: tuple[str, ...] = ("h800-1.5b", "h800-7b")
    contexts: tuple[int, ...] = (16384, 32768)
    prompt_reserve: int = 1024
    """``max_new_tokens = context - prompt_reserve`` (AReaL's benchmark)."""
    gpu_counts: tuple[int, ...] = (32, 64, 128, 256, 512)
    scaling_eta: int = 4
    step_time_eta: int = 8
    step_time_rows: tuple[tuple[str, int], ...] = (("h800-1.5b", 128), ("h800-7b", 192))
    inference_fraction: float = 0.75
    eta_steps: int = 100
    """Steps of the η sweep and the step-time rows (large η holds much inventory: a short horizon
    under-states it; ``horizon_check`` measures by how much)."""
    scaling_steps: int = 40
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CurvePoint:
    """One simulated point of one curve."""

    curve: str
    """``eta``, ``scaling`` or ``step_time``."""
    profile: str
    gpus: int
    max_new_tokens: int
    arm: Arm
    max_staleness: int
    tokens_per_s: float
    """AReaL's effective training throughput: tokens trained by the steps after the warm-up over the time
    they took (``window_trained_tokens_per_s``); counts nothing still in flight or buffered."""
    steady_state_tokens_per_s: float
    """This project's steady-state figure (``controller.throughput``: generated in the window, less what never
    finished, scaled to trained): lower than ``tokens_per_s`` while inventory grows (large η, short runs)."""
    step_s: float
    """Mean simulated seconds per step in the steady-state window."""
    staleness_mean: float
    engine_busy: float
    trainer_busy: float
    stale_groups: int
    engines: int
    trainer_ranks: int
    steps: int
    cpu_s: float

    @property
    def eta_label(self) -> str:
        return "unbounded" if self.max_staleness >= UNBOUNDED else str(self.max_staleness)

    def as_row(self) -> dict[str, Any]:
        return {**asdict(self), "eta": self.eta_label}


def window_trained_tokens_per_s(sim: Simulation) -> float:
    """Tokens trained by the steps ending after the warm-up, over the window's length."""
    r = sim.result
    window = r.sim_time_s - r.window_start_s
    steps = [m for m in sim.raw["metrics"] if m.get("applied", True) and float(m["time_s"]) > r.window_start_s]
    return sum(m["trained_tokens"] for m in steps) / window if window > 0 else 0.0


def steady_step_s(r: SimResult) -> float:
    """Seconds per step after the warm-up (the window ``controller.throughput`` measures in)."""
    if r.window_start_s <= 0:
        return r.sim_time_s / max(1, r.steps)
    return (r.sim_time_s - r.window_start_s) / max(1, r.steps - r.steps // 10)


def arm_keys(arm: Arm, gpus: int, eta: int, inference_fraction: float) -> dict[str, Any]:
    """Scenario keys of an arm on ``gpus`` devices (one device per engine and per rank)."""
    match arm:
        case "async":
            return {"gpus": gpus, "inference_fraction": inference_fraction, "max_staleness": eta}
        case "sync":
            return {"gpus": gpus, "inference_fraction": inference_fraction, "max_staleness": 0}
        case "sync-colocated":
            return {"gpus": 0, "engines": gpus, "trainer_ranks": gpus, "max_staleness": 0}
        case _:
            raise ValueError(f"unknown arm {arm!r} ({', '.join(get_args(Arm))})")


def simulate_point(
    run: Runner,
    spec: CurvesSpec,
    curve: str,
    profile: str,
    gpus: int,
    max_new_tokens: int,
    arm: Arm,
    eta: int,
    steps: int | None = None,
) -> CurvePoint:
    """One point: the workload on ``gpus`` devices of ``profile`` under ``arm``."""
    keys = {
        **spec.workload,
        "profile": profile,
        "max_new_tokens": max_new_tokens,
        "seed": spec.seed,
        "total_steps": steps or (spec.scaling_steps if curve == "scaling" else spec.eta_steps),
        "high_water_batches": 0,
        **arm_keys(arm, gpus, eta, spec.inference_fraction),
    }
    sim = run(with_overrides(Scenario(), keys))
    r = sim.result
    return CurvePoint(
        curve=curve,
        profile=profile,
        gpus=gpus,
        max_new_tokens=max_new_tokens,
        arm=arm,
        max_staleness=int(keys["max_staleness"]),
        tokens_per_s=window_trained_tokens_per_s(sim),
        steady_state_tokens_per_s=r.steady_state_tokens_per_s,
        step_s=steady_step_s(r),
        staleness_mean=r.staleness_mean,
        engine_busy=r.engine_busy_frac,
        trainer_busy=r.trainer_busy_frac,
        stale_groups=r.groups.get("stale", 0),
        engines=r.engines,
        trainer_ranks=r.trainer_ranks,
        steps=r.steps,
        cpu_s=r.cpu_s,
    )


def eta_points(run: Runner, spec: CurvesSpec) -> list[CurvePoint]:
    """The η sweep: η = 0 as ``sync``, the rest ``async``, on ``eta_gpus`` devices of ``eta_profile``."""
    where = (spec.eta_profile, spec.eta_gpus, spec.eta_max_new_tokens)
    return [simulate_point(run, spec, "eta", *where, "sync" if eta == 0 else "async", eta) for eta in spec.etas]


def scaling_points(run: Runner, spec: CurvesSpec) -> list[CurvePoint]:
    """Every profile x context x GPU count x arm (async at ``scaling_eta``, sync, sync-colocated)."""
    return [
        simulate_point(run, spec, "scaling", profile, gpus, ctx - spec.prompt_reserve, arm, spec.scaling_eta)
        for profile in spec.scaling_profiles
        for ctx in spec.contexts
        for arm in ("async", "sync", "sync-colocated")
        for gpus in spec.gpu_counts
    ]


def step_time_points(run: Runner, spec: CurvesSpec, reuse: Sequence[CurvePoint] = ()) -> list[CurvePoint]:
    """Table 1's rows: sync and async (``step_time_eta``) at each row's GPU count; a matching point of
    ``reuse`` (the η sweep) is taken instead of simulated again."""
    out: list[CurvePoint] = []
    for profile, gpus in spec.step_time_rows:
        for arm, eta in (("sync", 0), ("async", spec.step_time_eta)):
            same = [
                p
                for p in reuse
                if (p.profile, p.gpus, p.arm, p.max_staleness, p.max_new_tokens)
                == (profile, gpus, arm, eta, spec.eta_max_new_tokens)
            ]
            point = (
                same[0]
                if same
                else simulate_point(run, spec, "step_time", profile, gpus, spec.eta_max_new_tokens, arm, eta)
            )
            out.append(CurvePoint(**{**asdict(point), "curve": "step_time"}))
    return out


def fit_length_median(
    run: Runner,
    spec: CurvesSpec,
    target_step_s: float,
    lo: float = 300.0,
    hi: float = 12000.0,
    iters: int = 9,
    steps: int = 20,
) -> dict[str, Any]:
    """The workload's ``length_median`` (log-normal shape kept) at which the η sweep's synchronous point
    (``eta_profile`` on ``eta_gpus``) takes ``target_step_s`` per step: bisection on a log scale over
    ``[lo, hi]`` (a synchronous step grows with the lengths). Returns the median and the trace."""
    trace = []
    where = (spec.eta_profile, spec.eta_gpus, spec.eta_max_new_tokens)
    for _ in range(iters):
        mid = (lo * hi) ** 0.5
        fitted = CurvesSpec(**{**asdict(spec), "workload": {**spec.workload, "length_median": mid}})
        step_s = simulate_point(run, fitted, "fit", *where, "sync", 0, steps=steps).step_s
        trace.append({"length_median": mid, "step_s": step_s})
        lo, hi = (mid, hi) if step_s < target_step_s else (lo, mid)
    best = min(trace, key=lambda t: abs(t["step_s"] - target_step_s))
    return {
        "length_median": round(best["length_median"]),
        "target_step_s": target_step_s,
        "steps": steps,
        "trace": trace,
    }


def plateau_eta(by_eta: dict[str, float], fraction: float = 0.95) -> str | None:
    """The smallest η (in the given order) whose throughput reaches ``fraction`` of the largest."""
    if not by_eta:
        return None
    top = max(by_eta.values())
    return next(k for k, v in by_eta.items() if v >= fraction * top)


def is_monotone(values: Sequence[float], tolerance: float = 0.02) -> bool:
    """Non-decreasing, allowing a drop of ``tolerance`` (relative) between neighbours (simulation noise)."""
    return all(b >= a * (1 - tolerance) for a, b in zip(values, values[1:], strict=False))


def analyse_eta(points: Sequence[CurvePoint]) -> dict[str, Any]:
    """Per η: sim and paper throughput, each relative to its η = 0, and sim / paper; shape figures."""
    sim = {p.eta_label: p.tokens_per_s for p in points}
    paper = PAPER["eta_throughput"]["tokens_per_s"]
    base_sim, base_paper = sim.get("0"), paper["0"]
    rows = []
    for label, value in sim.items():
        rel = value / base_sim if base_sim else None
        paper_value = paper.get(label)
        paper_rel = paper_value / base_paper if paper_value is not None else None
        rows.append(
            {
                "eta": label,
                "sim_tokens_per_s": value,
                "paper_tokens_per_s": paper_value,
                "ratio_sim_paper": value / paper_value if paper_value else None,
                "sim_relative": rel,
                "paper_relative": paper_rel,
                "relative_ratio_sim_paper": rel / paper_rel if rel and paper_rel else None,
            }
        )
    bounded = {k: v for k, v in sim.items() if k != "unbounded"}
    return {
        "rows": rows,
        "sim_monotone": is_monotone(list(bounded.values())),
        "paper_monotone": is_monotone(list(paper.values()), tolerance=0.0),
        "sim_plateau_eta_95": plateau_eta(bounded),
        "paper_plateau_eta_95": plateau_eta(dict(paper)),
        "sim_plateau_eta_90": plateau_eta(bounded, 0.90),
        "paper_plateau_eta_90": plateau_eta(dict(paper), 0.90),
        "sim_max_speedup": max(bounded.values()) / base_sim if base_sim else None,
        "paper_max_speedup": max(paper.values()) / base_paper,
    }


def analyse_scaling(points: Sequence[CurvePoint]) -> list[dict[str, Any]]:
    """Per profile x context x arm: throughput by GPUs, efficiency against linear from the smallest
    count, and the async / sync and async / sync-colocated ratios at each count."""
    groups: dict[tuple[str, int, str], dict[int, float]] = {}
    for p in points:
        groups.setdefault((p.profile, p.max_new_tokens, p.arm), {})[p.gpus] = p.tokens_per_s
    out = []
    for (profile, new_tokens, arm), by_gpus in groups.items():
        gpus = sorted(by_gpus)
        g0, g1 = gpus[0], gpus[-1]
        eff = {g: (by_gpus[g] / by_gpus[g0]) / (g / g0) if by_gpus[g0] else None for g in gpus}
        row: dict[str, Any] = {
            "profile": profile,
            "max_new_tokens": new_tokens,
            "arm": arm,
            "tokens_per_s": {str(g): by_gpus[g] for g in gpus},
            "efficiency": {str(g): eff[g] for g in gpus},
            "efficiency_smallest_to_largest": eff[g1],
            "from_gpus": g0,
            "to_gpus": g1,
        }
        if arm == "async":
            for base in ("sync", "sync-colocated"):
                ref = groups.get((profile, new_tokens, base), {})
                row[f"speedup_vs_{base}"] = {str(g): by_gpus[g] / ref[g] for g in gpus if ref.get(g)}
        out.append(row)
    return out


def analyse_step_time(points: Sequence[CurvePoint]) -> list[dict[str, Any]]:
    """Table 1 side by side: seconds per step, sim and paper, and each side's sync / async ratio."""
    rows = []
    for paper_row in PAPER["step_time"]["rows"]:
        mine = {p.arm: p for p in points if (p.profile, p.gpus) == (paper_row["profile"], paper_row["gpus"])}
        if "sync" not in mine or "async" not in mine:
            continue
        paper_sync, paper_async = paper_row["sync_hours"] * 3.6, paper_row["async_hours"] * 3.6  # s per step
        sim_sync, sim_async = mine["sync"].step_s, mine["async"].step_s
        rows.append(
            {
                "model": paper_row["model"],
                "profile": paper_row["profile"],
                "gpus": paper_row["gpus"],
                "eta": mine["async"].max_staleness,
                "paper_sync_step_s": paper_sync,
                "paper_async_step_s": paper_async,
                "sim_sync_step_s": sim_sync,
                "sim_async_step_s": sim_async,
                "ratio_sim_paper_sync": sim_sync / paper_sync,
                "ratio_sim_paper_async": sim_async / paper_async,
                "paper_speedup": paper_sync / paper_async,
                "sim_speedup": sim_sync / sim_async if sim_async else None,
            }
        )
    return rows


def analyse(eta: Sequence[CurvePoint], scaling: Sequence[CurvePoint], step: Sequence[CurvePoint]) -> dict[str, Any]:
    """The three comparisons (``analyse_eta``, ``analyse_scaling``, ``analyse_step_time``)."""
    return {"eta": analyse_eta(eta), "scaling": analyse_scaling(scaling), "step_time": analyse_step_time(step)}
