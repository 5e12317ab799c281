"""Small statistics of the benchmarks: means with a 95% interval over seeds, time to a target.

Pure functions over plain numbers (no project imports), shared by ``bench async``,
``bench headline`` and ``bench ablation``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

# Two-sided 95% quantiles of Student's t by degrees of freedom (1..30); normal beyond.
_T95 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def t95(dof: int) -> float:
    """The two-sided 95% quantile of Student's t with ``dof`` degrees of freedom (the table to 30,
    then the Cornish-Fisher expansion, within 1e-3)."""
    if dof < 1:
        raise ValueError("a t interval needs at least two values")
    if dof <= len(_T95):
        return _T95[dof - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)


def mean_ci95(values: Sequence[float]) -> dict[str, float | int | None]:
    """Mean, sample std, and the 95% t-interval of the mean (``low``/``high`` None for one value;
    infinite values make the mean infinite and the interval unbounded above)."""
    vals = [float(v) for v in values]
    if not vals:
        return {"n": 0, "mean": None, "std": None, "low": None, "high": None}
    if any(math.isinf(v) for v in vals):
        finite = [v for v in vals if not math.isinf(v)]
        return {"n": len(vals), "mean": math.inf, "std": None, "low": min(finite, default=math.inf), "high": math.inf}
    mean = statistics.fmean(vals)
    if len(vals) == 1:
        return {"n": 1, "mean": mean, "std": None, "low": None, "high": None}
    std = statistics.stdev(vals)
    half = t95(len(vals) - 1) * std / math.sqrt(len(vals))
    return {"n": len(vals), "mean": mean, "std": std, "low": mean - half, "high": mean + half}


def time_to_target(curve: Sequence[tuple[float, float]], target: float, hold: bool = True) -> float:
    """The first time a run's accuracy reaches ``target`` and holds it at the next evaluation (``hold=False``: the
    first crossing, held or not).

    ``curve``: (time, accuracy) pairs in time order. The crossing time is interpolated linearly
    between the evaluation before it and the first one at or above the target (an evaluation's
    time is when its policy was published); the last evaluation needs no successor. ``inf`` when
    the target is never reached (and held)."""
    for i, (t, acc) in enumerate(curve):
        if acc < target:
            continue
        if hold and i + 1 < len(curve) and curve[i + 1][1] < target:
            continue
        if i == 0:
            return t
        t_prev, acc_prev = curve[i - 1]
        if acc == acc_prev:
            return t
        return t_prev + (t - t_prev) * (target - acc_prev) / (acc - acc_prev)
    return math.inf


def accuracy_at(curve: Sequence[tuple[float, float]], t: float) -> float:
    """A run's accuracy at time ``t``, linear between its evaluations (``curve``: (time, accuracy) in
    time order); ``t`` outside ``[first, last]`` evaluation is an error: a run says nothing there."""
    if not curve or not curve[0][0] <= t <= curve[-1][0]:
        raise ValueError(f"time {t} is outside the evaluated span of the run")
    for (t0, a0), (t1, a1) in zip(curve, curve[1:], strict=False):
        if t0 <= t <= t1:
            return a0 if t1 == t0 else a0 + (a1 - a0) * (t - t0) / (t1 - t0)
    return curve[-1][1]
