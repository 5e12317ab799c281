"""``python -m benchmarks headline --reevaluate FILE...``: evaluate a finished headline bench's snapshots
again, with more samples per held-out prompt, and analyse the runs of several such files together.

A headline run's speed-up hangs on two noisy numbers: the synchronous run's final accuracy (which
sets the target) and the evaluation at which each arm first holds it. With ``eval.samples_per_prompt
= 2`` on 64 held-out questions an evaluation is 128 samples, a standard error of about 4.4 points:
one unlucky evaluation moves a target or a crossing by a whole snapshot. This module re-scores every
snapshot the runs saved on the same held-out questions with ``samples_per_prompt`` samples each
(the runs, their timings and their throughput are not touched: only the accuracy curves change), so
that the analysis (``headline.analyse``, its rule unchanged) rests on less noise.

- **Several files, one analysis.** Rows of every source file are pooled (seeds must not repeat);
  the sources must agree on the workload, the target fraction and the warm-up. Each row is evaluated
  with its own file's overrides (files built at different times may name different, equal warm
  starts), with only ``eval.samples_per_prompt`` changed.
- **Identical snapshots once.** A snapshot's accuracy is memoised by its weights' SHA-256 and the
  evaluation overrides: every run's version-0 snapshot is the same warm start, evaluated once.
- **Nothing lost.** After every row the payload so far is written to ``<json>.partial.json``; a
  rerun of the same command reuses the rows found there (by run directory) and evaluates the rest.
- The first evaluation's curve stays in each row as ``curve_first_evaluation``, its sample count in
  the payload as ``first_eval_samples``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.headline import SAMPLES_KEY, evaluate_snapshots, finish, with_samples_per_prompt
from benchmarks.runs import resolve_run_dir

__all__ = ["SAMPLES_KEY", "reevaluate", "with_samples_per_prompt"]

SAME_ACROSS_SOURCES = ("bench", "workload", "target_fraction", "warmup_s", "sync_setting", "time_budget_s")
"""What every source file must agree on to be analysed together."""

_ABSENT_MEANS = {"time_budget_s": 0.0}
"""A file written before the field existed ran without it: its value."""


def _setting(payload: dict[str, Any], key: str) -> Any:
    return payload.get(key, _ABSENT_MEANS.get(key))


def _weights_digest(snapshot_dir: Path) -> str:
    files = sorted(snapshot_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"snapshot {snapshot_dir} holds no *.safetensors weights")
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _load_sources(sources: Sequence[str]) -> list[dict[str, Any]]:
    payloads = [json.loads(Path(s).read_text()) for s in sources]
    if not payloads:
        raise ValueError("--reevaluate needs at least one headline result file")
    for source, payload in zip(sources, payloads, strict=True):
        if payload.get("bench") != "headline":
            raise ValueError(f"{source}: not a bench headline result (bench={payload.get('bench')!r})")
        for key in SAME_ACROSS_SOURCES:
            if _setting(payload, key) != _setting(payloads[0], key):
                raise ValueError(
                    f"{source}: {key}={_setting(payload, key)!r} differs from {sources[0]}'s "
                    f"{_setting(payloads[0], key)!r}; these runs cannot be analysed together"
                )
    seeds = [seed for p in payloads for seed in p["seeds"]]
    if len(seeds) != len(set(seeds)):
        raise ValueError(f"seeds repeat across the source files ({sorted(seeds)}): each seed must come from one file")
    settings = [_evaluation_settings(p["overrides"]) for p in payloads]
    for source, setting in zip(sources, settings, strict=True):
        for key, value in setting.items():
            if value != settings[0][key]:
                raise ValueError(
                    f"{source}: its {key} settings differ from {sources[0]}'s ({value!r} against "
                    f"{settings[0][key]!r}); these runs cannot be analysed together"
                )
    return payloads


def _evaluation_settings(overrides: Sequence[str]) -> dict[str, Any]:
    """What must be equal for two files' evaluations to be comparable: the task (its held-out split),
    the evaluation settings and the sampling temperature (the warm start may differ: it is recorded)."""
    from dataclasses import asdict

    from asyncrl.config import load_config

    cfg = load_config(None, with_samples_per_prompt(overrides, 1))
    return {"task": asdict(cfg.task), "eval": asdict(cfg.eval), "rollout.temperature": cfg.rollout.temperature}


def _write_atomically(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(".tmp")
    scratch.write_text(json.dumps(payload, indent=2, default=str))
    scratch.replace(path)


def _evaluate_row(
    row: dict[str, Any], overrides: list[str], memo: dict[tuple[str, ...], float], source: str
) -> list[float]:
    accuracies = []
    for snap in row["snapshots"]:
        path = resolve_run_dir(snap["path"], source)  # stored relative to where the bench ran
        key = (_weights_digest(path), *overrides)
        if key not in memo:
            started = time.perf_counter()
            memo[key] = evaluate_snapshots(overrides, [{**snap, "path": str(path)}])[0]
            print(
                f"  v{snap['version']:>4} at {snap['t']:7.1f} s: accuracy {memo[key]:.4f} "
                f"({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
        accuracies.append(memo[key])
    return accuracies


def reevaluate(
    sources: Sequence[str], json_path: str, *, samples_per_prompt: int, etas: Sequence[int] | None = None
) -> dict[str, Any]:
    """Re-evaluate the snapshots of the rows of ``sources`` (only arms in ``etas``; None: all) with
    ``samples_per_prompt`` samples per held-out prompt and analyse them together into ``json_path``
    (see the module docstring)."""
    if samples_per_prompt < 1:
        raise ValueError(f"samples per prompt must be >= 1, got {samples_per_prompt}")
    payloads = _load_sources(sources)
    partial_path = Path(json_path).with_suffix(".partial.json")
    done: dict[str, dict[str, Any]] = {}
    if partial_path.exists():
        done = {row["run_dir"]: row for row in json.loads(partial_path.read_text())["rows"]}
        print(f"reusing the evaluated rows of {partial_path} that match ({len(done)} there)")
    memo: dict[tuple[str, ...], float] = {}
    rows: list[dict[str, Any]] = []
    first_samples = sorted({p.get("eval_samples") or 0 for p in payloads})
    payload: dict[str, Any] = {
        **{key: _setting(payloads[0], key) for key in SAME_ACROSS_SOURCES},
        "overrides": with_samples_per_prompt(payloads[0]["overrides"], samples_per_prompt),
        "seeds": sorted(seed for p in payloads for seed in p["seeds"]),
        "etas": sorted({eta for p in payloads for eta in p["etas"] if etas is None or eta in etas}),
        "snapshot_every_s": payloads[0].get("snapshot_every_s"),
        "first_eval_samples": first_samples[0] if len(first_samples) == 1 else first_samples,
        "reevaluated_from": [
            {
                "file": str(s),
                "overrides": p["overrides"],
                "eval_samples": p.get("eval_samples"),
                "start_weights_sha256": _weights_digest(resolve_run_dir(p["rows"][0]["snapshots"][0]["path"], s)),
            }
            for s, p in zip(sources, payloads, strict=True)
        ],
        "samples_per_prompt": samples_per_prompt,
        "rows": rows,
    }
    for source, source_payload in zip(sources, payloads, strict=True):
        overrides = with_samples_per_prompt(source_payload["overrides"], samples_per_prompt)
        from asyncrl.config import load_config

        cfg = load_config(None, overrides)
        eval_samples = cfg.task.eval_size * (1 if cfg.eval.greedy else samples_per_prompt)
        if payload.setdefault("eval_samples", eval_samples) != eval_samples:
            raise ValueError(f"{source}: {eval_samples} samples per evaluation, the others {payload['eval_samples']}")
        for row in source_payload["rows"]:
            if etas is not None and row["max_staleness"] not in etas:
                continue
            if row["run_dir"] in done:
                kept = done[row["run_dir"]]
                if kept.get("eval_overrides") != overrides:
                    raise ValueError(
                        f"{partial_path} holds {row['run_dir']} evaluated with other settings "
                        f"({kept.get('eval_overrides')}); remove the file or rerun as before"
                    )
                rows.append(kept)
                continue
            print(
                f"\n=== re-evaluating {source}: seed {row['seed']}, max_staleness={row['max_staleness']} ===",
                flush=True,
            )
            accuracies = _evaluate_row(row, overrides, memo, str(source))
            new_row = {**row, "curve_first_evaluation": row["curve"], "eval_overrides": overrides}
            new_row["curve"] = [(s["t"], a) for s, a in zip(row["snapshots"], accuracies, strict=True)]
            rows.append(new_row)
            _write_atomically(partial_path, payload)
    result = finish(payload, json_path)
    partial_path.unlink(missing_ok=True)
    return result
