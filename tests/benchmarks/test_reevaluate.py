"""``bench headline --reevaluate``: every snapshot scored again with the new sample count (the
evaluation faked at its seam), sources pooled and checked, identical weights scored once, and an
interrupted re-evaluation resumed from its partial file without scoring a row twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import reevaluate as reevaluate_module
from benchmarks.reevaluate import reevaluate, with_samples_per_prompt

BASE = ["task.eval_size=8", "eval.samples_per_prompt=2", "eval.report_greedy=false"]


def _snapshot(root: Path, name: str, weights: bytes, version: int, t: float) -> dict:
    path = root / name
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(weights)
    return {"version": version, "t": t, "path": str(path)}


def _source(root: Path, file: str, seeds: list[int], etas: list[int]) -> str:
    rows = []
    for seed in seeds:
        for eta in etas:
            run = root / f"s{seed}-eta{eta}"
            snaps = [_snapshot(run, "v0", b"warm start", 0, 0.0)]  # every run starts from the same weights
            snaps += [_snapshot(run, f"v{v}", f"{seed}-{eta}-{v}".encode(), v, 10.0 * v / (1 + eta)) for v in (1, 2)]
            rows.append(
                {
                    "seed": seed,
                    "max_staleness": eta,
                    "run_dir": str(run),
                    "snapshots": snaps,
                    "curve": [(s["t"], 0.1) for s in snaps],
                    "staleness_mean": eta / 2.0,
                    "steady_state_tokens_per_s": 100.0 * (1 + eta),
                    "trained_tokens_per_s": 90.0,
                }
            )
    payload = {
        "bench": "headline",
        "workload": "task",
        "target_fraction": 0.9,
        "warmup_s": 10.0,
        "sync_setting": "threads1-trainer-process",
        "overrides": BASE,
        "seeds": seeds,
        "etas": etas,
        "eval_samples": 16,
        "rows": rows,
    }
    path = root / file
    path.write_text(json.dumps(payload))
    return str(path)


class FakeEvaluation:
    """Accuracy from the snapshot's version (0.2 + 0.2 per version); records every call."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.calls: list[tuple[list[str], str]] = []
        self.fail_after = fail_after

    def __call__(self, overrides: list[str], snapshots: list[dict]) -> list[float]:
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise RuntimeError("evaluation interrupted")
        self.calls += [(overrides, s["path"]) for s in snapshots]
        return [0.2 + 0.2 * s["version"] for s in snapshots]


def test_samples_per_prompt_is_replaced_not_added() -> None:
    assert with_samples_per_prompt(BASE, 8) == [
        "task.eval_size=8",
        "eval.report_greedy=false",
        "eval.samples_per_prompt=8",
    ]


def test_every_snapshot_is_scored_again_and_sources_are_analysed_together(tmp_path, monkeypatch) -> None:
    fake = FakeEvaluation()
    monkeypatch.setattr(reevaluate_module, "evaluate_snapshots", fake)
    first = _source(tmp_path / "a", "a.json", [0, 1], [0, 4, 8])
    second = _source(tmp_path / "b", "b.json", [2], [0, 4])
    out = tmp_path / "out.json"
    result = reevaluate([first, second], str(out), samples_per_prompt=8, etas=(0, 4))
    assert sorted((r["seed"], r["max_staleness"]) for r in result["rows"]) == [
        (0, 0),
        (0, 4),
        (1, 0),
        (1, 4),
        (2, 0),
        (2, 4),
    ]
    # the shared warm start once, then two snapshots per run; always with 8 samples per prompt
    assert len(fake.calls) == 1 + 6 * 2
    assert all(o[-1] == "eval.samples_per_prompt=8" and "eval.samples_per_prompt=2" not in o for o, _ in fake.calls)
    row = result["rows"][0]
    assert [a for _t, a in row["curve"]] == pytest.approx([0.2, 0.4, 0.6])
    assert [a for _t, a in row["curve_first_evaluation"]] == [0.1, 0.1, 0.1]
    assert result["eval_samples"] == 8 * 8 and result["first_eval_samples"] == 16 and result["seeds"] == [0, 1, 2]
    assert result["summary"]["eta4"]["speedup"]["n"] == 3 and "target_from_sync_plateau" in result
    assert json.loads(out.read_text())["summary"]["eta4"]["speedup"]["mean"] == pytest.approx(5.0)
    assert not out.with_suffix(".partial.json").exists()


def test_an_interrupted_reevaluation_resumes_without_scoring_a_row_twice(tmp_path, monkeypatch) -> None:
    source = _source(tmp_path, "a.json", [0], [0, 4])
    out = tmp_path / "out.json"
    monkeypatch.setattr(reevaluate_module, "evaluate_snapshots", FakeEvaluation(fail_after=4))
    with pytest.raises(RuntimeError, match="interrupted"):
        reevaluate([source], str(out), samples_per_prompt=4)
    assert len(json.loads(out.with_suffix(".partial.json").read_text())["rows"]) == 1
    resumed = FakeEvaluation()
    monkeypatch.setattr(reevaluate_module, "evaluate_snapshots", resumed)
    result = reevaluate([source], str(out), samples_per_prompt=4)
    assert {path.split("/")[-2] for _o, path in resumed.calls} == {"s0-eta4"}  # only the row not yet done
    assert len(result["rows"]) == 2 and not out.with_suffix(".partial.json").exists()


def test_sources_that_cannot_be_pooled_are_refused(tmp_path) -> None:
    first = _source(tmp_path / "a", "a.json", [0], [0, 4])
    again = _source(tmp_path / "b", "b.json", [0], [0, 4])
    with pytest.raises(ValueError, match="seeds repeat"):
        reevaluate([first, again], str(tmp_path / "o.json"), samples_per_prompt=8)
    other = json.loads(Path(again).read_text()) | {"seeds": [5], "target_fraction": 0.5}
    Path(again).write_text(json.dumps(other))
    with pytest.raises(ValueError, match="target_fraction"):
        reevaluate([first, again], str(tmp_path / "o.json"), samples_per_prompt=8)
    with pytest.raises(ValueError, match=">= 1"):
        reevaluate([first], str(tmp_path / "o.json"), samples_per_prompt=0)


def test_relative_snapshot_paths_are_found_from_another_folder_and_missing_weights_are_named(
    tmp_path, monkeypatch
) -> None:
    root = tmp_path / "repo"
    source = _source(root, "results.json", [0], [0])
    payload = json.loads(Path(source).read_text())
    for snap in payload["rows"][0]["snapshots"]:  # stored as the bench wrote them: relative to where it ran
        snap["path"] = str(Path(snap["path"]).relative_to(root))
    Path(source).write_text(json.dumps(payload))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    fake = FakeEvaluation()
    monkeypatch.setattr(reevaluate_module, "evaluate_snapshots", fake)
    reevaluate([source], str(tmp_path / "out.json"), samples_per_prompt=4)
    assert len(fake.calls) == 3 and all(Path(path).is_absolute() and Path(path).is_dir() for _o, path in fake.calls)
    (root / "s0-eta0" / "v2" / "model.safetensors").unlink()  # a snapshot without weights: named, never hashed as b""
    with pytest.raises(FileNotFoundError, match="v2 holds no"):
        reevaluate([source], str(tmp_path / "out2.json"), samples_per_prompt=4)


def test_a_resume_with_other_settings_is_refused_and_sources_must_evaluate_alike(tmp_path, monkeypatch) -> None:
    source = _source(tmp_path / "a", "a.json", [0], [0, 4])
    out = tmp_path / "out.json"
    monkeypatch.setattr(reevaluate_module, "evaluate_snapshots", FakeEvaluation(fail_after=4))
    with pytest.raises(RuntimeError, match="interrupted"):
        reevaluate([source], str(out), samples_per_prompt=4)
    monkeypatch.setattr(reevaluate_module, "evaluate_snapshots", FakeEvaluation())
    with pytest.raises(ValueError, match="other settings"):  # the kept row was scored at 4 per prompt
        reevaluate([source], str(out), samples_per_prompt=16)
    other = _source(tmp_path / "b", "b.json", [1], [0, 4])
    payload = json.loads(Path(other).read_text())
    Path(other).write_text(json.dumps(payload | {"overrides": [*BASE, "eval.max_new_tokens=7"]}))
    with pytest.raises(ValueError, match="eval settings differ"):
        reevaluate([source, other], str(tmp_path / "o.json"), samples_per_prompt=4)
