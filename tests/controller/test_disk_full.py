"""A full disk under a run (issue 14 item 4), without root: ENOSPC injected at the first write of a
jsonl line and of a checkpoint, on the real loop over the scripted engine and trainer.

Each case: the run stops with ``storage.DiskFull`` naming the file, saying the disk is full and how
to resume; no file holds a torn line; no half-written checkpoint is taken for a good one; and once
space is back the run resumes from its newest good checkpoint with the ledger checks of the no-loss
invariant passing (nothing lost, nothing trained twice, the staleness bound kept).
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest

from asyncrl.controller.loop import Controller
from asyncrl.controller.resume import latest_checkpoint
from asyncrl.controller.rundir import RunDir
from asyncrl.storage import DiskFull, find_disk_full, raise_disk_full
from asyncrl.trainer.checkpoint import atomic_dir
from tests.controller.fakes import ScriptedEngine, ScriptedTrainer
from tests.controller.test_loop_fake import _resume, _resume_cfg, _run
from tests.invariants import test_no_loss_on_resume as invariant

ENOSPC = OSError(errno.ENOSPC, "No space left on device")


class FullAfter:
    """A run-directory file whose write fails with ENOSPC at the first line for which ``when(data)``
    holds (the first ``half`` of it reaches the disk first, as when a disk fills mid-write)."""

    def __init__(self, fh: Any, when: Any) -> None:
        self.fh, self.when, self.failed = fh, when, 0

    def write(self, data: memoryview) -> int:
        if self.when(bytes(data)):
            self.failed += 1
            self.fh.write(data[: len(data) // 2])
            raise ENOSPC
        return self.fh.write(data)

    def __getattr__(self, name: str) -> Any:  # tell, seek, fileno, name, close
        return getattr(self.fh, name)


def _complete_lines(path: Path) -> list[dict[str, Any]]:
    raw = path.read_bytes()
    assert not raw or raw.endswith(b"\n"), f"{path.name} ends in a torn line"
    return [json.loads(line) for line in raw.splitlines()]  # every line parses


def _stopped_by_disk_full(run: Any) -> DiskFull:
    with pytest.raises(Exception) as info:
        run()
    full = find_disk_full(info.value)
    assert full is not None, info.value
    return full


def _nth(n: int) -> Any:
    """True at the ``n``-th call (the timeline is sampled every 0.25 s, whatever the lines say)."""
    calls = [0]

    def when(data: bytes) -> bool:
        calls[0] += 1
        return calls[0] == n

    return when


@pytest.mark.parametrize(
    ("attr", "name", "when", "step_s"),
    [
        ("_ledger", "trajectories.jsonl", lambda d: b'"trained_step": 5' in d, 0.002),  # the groups of step 5
        ("_metrics", "metrics.jsonl", lambda d: b'"step": 5,' in d, 0.002),
        ("_timeline", "timeline.jsonl", _nth(4), 0.1),  # a background task's write, 0.75 s in (step 6 or 7)
        ("_ledger", "trajectories.jsonl", lambda d: b'"admitted"' in d and b'"stream_index": 30,' in d, 0.002),
    ],
    ids=["ledger", "metrics", "timeline", "admission"],
)
def test_enospc_on_a_jsonl_line_stops_the_run_cleanly_and_it_resumes(
    tmp_path: Path, attr: str, name: str, when: Any, step_s: float
) -> None:
    cfg = _resume_cfg()
    files: list[FullAfter] = []

    def watch(controller: Controller) -> None:
        files.append(FullAfter(getattr(controller.rundir, attr), when))
        setattr(controller.rundir, attr, files[0])

    trainer = ScriptedTrainer(step_s=step_s)
    full = _stopped_by_disk_full(lambda: _run(cfg, ScriptedEngine(), trainer, tmp_path, watch=watch))
    assert files[0].failed == 1  # the first failed write stopped the run: nothing was written after it
    text = str(full)
    assert text.startswith(f"disk full: writing {tmp_path / name} failed (No space left on device;")
    assert "Every line written before it is kept" in text
    assert text.endswith(f"then resume the run: asyncrl train --resume {tmp_path}")
    for jsonl in ("metrics.jsonl", "trajectories.jsonl", "timeline.jsonl"):
        _complete_lines(tmp_path / jsonl)  # the half-written line was cut off
    assert latest_checkpoint(tmp_path) is not None
    # space is back: the run resumes from its newest checkpoint; the ledger shows no gap and no double
    state = _resume(cfg, tmp_path, step_s=0.002)
    assert state.step == invariant.STEPS and state.resumes == 1
    invariant.check_ledger(tmp_path)


class CheckpointOnAFullDisk(ScriptedTrainer):
    """Saves checkpoints like ``Trainer.save_checkpoint`` (``atomic_dir`` + ``raise_disk_full``), and
    the one of step ``full_at`` meets a full disk at its first write, after half a file."""

    full_at: int = 4

    def save_checkpoint(
        self, directory: str | Path, extra: dict[str, Any] | None = None, tokenizer: Any = None
    ) -> None:
        kept = f"The half-written checkpoint {directory} was discarded; the checkpoints before it are intact."
        with atomic_dir(directory) as tmp, raise_disk_full(directory, kept=kept):
            if self.version == self.full_at:
                (tmp / "model.safetensors").write_bytes(b"\x00" * 100)
                raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "model.safetensors"))
            (tmp / "trainer_state.pt").write_text(json.dumps({"version": self.version, "extra": extra}))


def test_enospc_in_a_checkpoint_leaves_the_previous_one_and_the_run_resumes(tmp_path: Path) -> None:
    cfg = _resume_cfg()  # a checkpoint every 2 steps
    full = _stopped_by_disk_full(lambda: _run(cfg, ScriptedEngine(), CheckpointOnAFullDisk(step_s=0.002), tmp_path))
    text = str(full)
    assert text.startswith("disk full: writing ") and ".step-00000004.tmp-" in text and "model.safetensors" in text
    assert "checkpoints/step-00000004 was discarded; the checkpoints before it are intact" in text
    assert text.endswith(f"then resume the run: asyncrl train --resume {tmp_path}")  # the loop named the run
    assert [p.name for p in sorted((tmp_path / "checkpoints").iterdir())] == ["step-00000002"]  # no partial one
    state = _resume(cfg, tmp_path, step_s=0.002)
    assert state.step == invariant.STEPS and state.resumes == 1
    invariant.check_ledger(tmp_path)


def test_a_real_enospc_from_the_kernel(tmp_path: Path) -> None:
    """``/dev/full`` answers every write with ENOSPC: the error is the same as on a full filesystem."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    run = RunDir(tmp_path, tensorboard=False)
    run.log_step({"step": 0})
    before = (tmp_path / "metrics.jsonl").read_bytes()
    (tmp_path / "timeline.jsonl").unlink()
    (tmp_path / "timeline.jsonl").symlink_to("/dev/full")
    run._timeline.close()
    run._timeline = open(tmp_path / "timeline.jsonl", "ab", buffering=0)
    with pytest.raises(DiskFull, match=r"disk full: writing .*timeline.jsonl failed \(No space left on device") as e:
        run.log_timeline({"t": 0.0})
    assert run.failed is e.value
    with pytest.raises(DiskFull) as again:  # every later line raises the same error: nothing is written past it
        run.log_step({"step": 1})
    assert again.value is e.value and (tmp_path / "metrics.jsonl").read_bytes() == before
    run.log_in_flight("p0", 0)  # end-of-run lines of a failed run are skipped, not raised (cleanup must finish)
    run.close()


def test_summary_and_config_are_replaced_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = RunDir(tmp_path, tensorboard=False)
    run.write_summary({"steps": 1})
    before = (tmp_path / "summary.json").read_bytes()

    def full(self: Path, data: str, *args: Any, **kwargs: Any) -> int:
        Path.write_bytes(self, data[:5].encode())  # a torn file, then the error
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(DiskFull, match="summary.json failed .* The previous summary.json is unchanged"):
        run.write_summary({"steps": 2})
    assert (tmp_path / "summary.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left
    run.close()
