"""The run directory (DESIGN §7): resolved config, metrics, the ledger, summary, TensorBoard.

- ``config.yaml``: the resolved config of the run;
- ``metrics.jsonl``: one JSON line per training step;
- ``trajectories.jsonl`` (the ledger): a ``resumed`` marker where a resume continued the run;
  one ``admitted`` line per prompt when it is admitted (its
  index in the prompt stream, the version it started at, whether it is re-admitted after a
  resume), then one line per sample once its fate is known (trained, filtered, dropped as stale,
  skipped with a non-finite step) or one line per prompt when the engine failed it after its
  retries, and, at the end of a run, lines for groups still unused or in flight; a multi-turn
  sample's line also holds its episode (``episode_entry``: model and environment tokens, turns, and
  each tool call's wait on the RL clock);
- ``timeline.jsonl``: a few samples a second of what each component is doing (for the report);
- ``summary.json``: written at the end;
- ``tb/``: TensorBoard events of the per-step metrics (when tensorboard is installed).
Each line goes to the file in one unbuffered write, so a killed run keeps everything up to the kill.
A full disk stops the run at the first write that fails (``storage.DiskFull``, naming the file):
the torn line is cut off, so every file holds complete lines only, and every later line of the run
raises the same error (nothing is recorded after a line that was lost; the end-of-run lines of a
run stopped this way are not needed, a resume cuts back to the checkpoint). ``config.yaml`` and
``summary.json`` are replaced atomically: a failed write leaves the previous file. On
resume the jsonl files (``JSONL_FILES``: metrics, ledger, timeline, policy snapshots) are cut back
to the byte offsets saved with the checkpoint (``offsets``); the cut tails are kept under
``resume/`` for forensics, never read again.
Run ids, the claim a new run makes on a directory and the one-run check readers make live in
``controller.run_claim``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from asyncrl.controller.run_claim import (
    JSONL_FILES,
    RunDirInUse,
    check_one_run,
    new_run_id,
    read_jsonl,  # noqa: F401  (kept importable from here: most readers of a run import it from rundir)
    run_ids,
)
from asyncrl.storage import disk_full, is_disk_full
from asyncrl.types import Group, Trajectory


def episode_entry(traj: Trajectory, rl_offset: float | None = None) -> dict[str, Any]:
    """A multi-turn episode's ledger fields: how it ended, and per turn its tokens, versions and tool use.
    ``rl_offset``: the run's RL time minus ``time.time()`` now; with it, a turn with tool calls whose step
    began at a known time also holds ``tool_wait``: [start, end] of that step on the RL clock (the clock
    of ``timeline.jsonl``'s ``t``), what the report draws as episodes waiting on a tool."""
    turns = []
    for t in traj.turns:
        turn = {
            "model_tokens": t.model_tokens,
            "env_tokens": t.env_tokens,
            "min_version": t.min_version,
            "max_version": t.max_version,
            "tool_calls": list(t.tool_calls),
            "tool_errors": t.tool_errors,
            "malformed": t.malformed,
            "tool_hits": t.tool_hits,
            "tool_latency_s": round(t.tool_latency_s, 4),
        }
        if rl_offset is not None and t.tool_calls and t.tool_started_at is not None:
            start = t.tool_started_at + rl_offset
            turn["tool_wait"] = [round(start, 4), round(start + t.tool_latency_s, 4)]
        turns.append(turn)
    return {
        "episode_end": traj.end,
        "model_tokens": sum(traj.loss_mask),
        "env_tokens": len(traj.loss_mask) - sum(traj.loss_mask),
        "turns": turns,
    }


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def code_version() -> dict[str, Any]:
    """Which code made a run (``summary.json``'s ``code``): the installed package's version and, when the package
    runs from a git checkout (``src/asyncrl`` of a repository), its commit and whether tracked files differ from it;
    both None for a package installed from a wheel or without git."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed: str | None = version("asyncrl")
    except PackageNotFoundError:  # run from a source tree that was never installed
        installed = None
    out: dict[str, Any] = {"asyncrl": installed, "git_commit": None, "git_dirty": None}
    package = Path(__file__).resolve().parents[1]
    root = package.parents[1]
    if package.parent.name != "src" or not (root / ".git").exists():
        return out
    git = ["git", "-C", str(root)]
    try:
        head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True)
        status = [*git, "status", "--porcelain", "--untracked-files=no"]
        changed = subprocess.run(status, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return out
    return {**out, "git_commit": head.stdout.strip(), "git_dirty": bool(changed.stdout.strip())}


class RunDir:
    """Writers for one run directory (append-only; safe to reopen on resume)."""

    def __init__(
        self,
        path: str | Path,
        config: Mapping[str, Any] | None = None,
        *,
        tensorboard: bool = True,
        truncate: dict[str, int] | None = None,
        purge_step: int | None = None,
    ) -> None:
        """``config``: the run's resolved config as plain data (``asyncrl.config.to_dict``), written to
        ``config.yaml``; ``truncate``: resume — cut each jsonl file back to this byte offset (missing names: to 0)
        first, and keep the run's id; ``purge_step``: TensorBoard drops its events from this step
        on (resume). A new run (no ``truncate``) refuses a directory whose jsonl files or summary
        already hold lines (:class:`RunDirInUse`; ``claim_run_dir`` says so earlier, with the ways out)."""
        if config is not None and not isinstance(config, Mapping):
            raise TypeError(f"RunDir takes the resolved config as plain data (to_dict), got {type(config).__name__}")
        self.path = Path(path)
        self.run_id: str | None
        if truncate is not None:
            ids = run_ids(self.path)
            found = check_one_run(self.path, ids)
            self.run_id = found if ids else new_run_id()  # None: a run from before run ids
        else:
            names = (*JSONL_FILES, "summary.json")
            held = [n for n in names if (self.path / n).is_file() and (self.path / n).stat().st_size]
            if held:
                raise RunDirInUse(
                    f"{self.path} already holds a run ({', '.join(held)}); a new run needs its own directory"
                )
            self.run_id = new_run_id()
        self.path.mkdir(parents=True, exist_ok=True)
        self._failed: OSError | None = None
        if config is not None:
            text = yaml.safe_dump(dict(config), sort_keys=False)
            self._replace("config.yaml", lambda tmp: tmp.write_text(text))
        if truncate is not None:
            for name in JSONL_FILES:
                self._truncate(name, int(truncate.get(name, 0)))
        self._metrics = open(self.path / "metrics.jsonl", "ab", buffering=0)
        self._ledger = open(self.path / "trajectories.jsonl", "ab", buffering=0)
        self._timeline = open(self.path / "timeline.jsonl", "ab", buffering=0)
        self._snapshots = open(self.path / "snapshots.jsonl", "ab", buffering=0)
        self._tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.path / "tb"), purge_step=purge_step)
            except Exception:  # tensorboard missing or broken: metrics.jsonl still has everything
                self._tb = None

    def _truncate(self, name: str, offset: int) -> None:
        """Cut ``name`` back to ``offset`` bytes; the tail goes to ``resume/<name>.<time>`` first (a
        full disk fails before anything is cut)."""
        path = self.path / name
        if not path.exists() or path.stat().st_size <= offset:
            return
        with open(path, "rb") as fh:
            fh.seek(offset)
            tail = fh.read()
        archive = self.path / "resume"
        archive.mkdir(exist_ok=True)
        saved = archive / f"{name}.cut-{time.strftime('%Y%m%d-%H%M%S')}-{offset}"
        try:
            saved.write_bytes(tail)
        except OSError as exc:
            saved.unlink(missing_ok=True)
            if is_disk_full(exc):
                raise disk_full(saved, exc, kept=f"Nothing was cut from {name} yet.", run_dir=self.path) from exc
            raise
        os.truncate(path, offset)

    def _replace(self, name: str, write: Any) -> None:
        """``write(tmp_path)`` then rename over ``name``: a failed write leaves the previous file."""
        final = self.path / name
        tmp = final.with_name(f".{name}.tmp-{os.getpid()}")
        try:
            write(tmp)
            os.replace(tmp, final)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if is_disk_full(exc):
                kept = f"The previous {name} is unchanged." if final.exists() else f"No {name} was written."
                raise disk_full(final, exc, kept=kept, run_dir=self.path) from exc
            raise

    def _append(self, fh: Any, text: str) -> None:
        """One write of ``text`` at the end of ``fh``. A failed write cuts the file back to where it
        was (no torn line) and is raised, as ``DiskFull`` for a full disk; every later write raises it
        again, so nothing is recorded after a line that was lost."""
        if self._failed is not None:
            raise self._failed
        data = memoryview(text.encode("utf-8"))
        start = fh.tell()
        try:
            while data:
                data = data[fh.write(data) :]
        except OSError as exc:
            with contextlib.suppress(OSError):  # not every file can be cut (a device): it was not ours
                os.ftruncate(fh.fileno(), start)
                fh.seek(start)
            failed: OSError = exc
            if is_disk_full(exc):
                kept = "Every line written before it is kept (the file holds complete lines only)."
                failed = disk_full(fh.name, exc, kept=kept, run_dir=self.path)
            self._failed = failed
            raise failed from exc

    @property
    def failed(self) -> OSError | None:
        """The error of the write that stopped this run directory (None: every write succeeded)."""
        return self._failed

    def offsets(self) -> dict[str, int]:
        """Byte length of each jsonl file now (every line written so far is flushed)."""
        return {
            "metrics.jsonl": self._metrics.tell(),
            "trajectories.jsonl": self._ledger.tell(),
            "timeline.jsonl": self._timeline.tell(),
            "snapshots.jsonl": self._snapshots.tell(),
        }

    def _stamp(self, line: dict[str, Any]) -> dict[str, Any]:
        """``line`` with the run id first (absent for a resumed run from before run ids)."""
        return line if self.run_id is None else {"run_id": self.run_id, **line}

    def _write_ledger(self, line: dict[str, Any]) -> None:
        self._append(self._ledger, json.dumps(self._stamp(line)) + "\n")

    def log_step(self, record: dict[str, Any]) -> None:
        """Append one step's metrics (and mirror the numeric ones to TensorBoard)."""
        clean = {k: _clean(v) for k, v in record.items()}
        self._append(self._metrics, json.dumps(self._stamp(clean)) + "\n")
        if self._tb is not None:
            step = int(record.get("step", 0))
            try:
                for key, value in record.items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                        self._tb.add_scalar(key, value, step)
            except Exception as exc:  # a full disk or a broken writer: metrics.jsonl has everything
                print(f"asyncrl: TensorBoard events off for the rest of the run ({exc})", file=sys.stderr)
                self._tb = None

    def log_group(
        self,
        group: Group,
        *,
        trained_step: int | None,
        dropped: str | None,
        status: str,
        tokenizer: Any | None = None,
        step: int | None = None,
        rl_offset: float | None = None,
    ) -> None:
        """One ledger line per sample of ``group``. ``status``: trained | filtered | stale |
        skipped | unused; ``dropped`` is the reason when it was not trained; ``step`` the training
        step at which a stale or skipped group met its fate; ``rl_offset``: the RL clock minus
        ``time.time()`` (``episode_entry``). ``unused`` lines (the end of a run) are
        not written once a write has failed: a resume cuts back to the checkpoint anyway."""
        if self._failed is not None and status == "unused":
            return
        lines = []
        for idx, comp in enumerate(group.completions):
            line = {
                "prompt_id": group.prompt.prompt_id,
                "sample_idx": idx,
                "status": status,
                "start_version": group.start_version,
                "min_version": comp.min_version,
                "max_version": comp.max_version,
                "reward": group.rewards[idx],
                "response_len": len(comp.output_ids),
                "finish_reason": comp.finish_reason,
                "num_interruptions": comp.num_interruptions,
                "trained_step": trained_step,
                "dropped": dropped,
                "reward_failure": group.reward_failures[idx] if group.reward_failures else None,
            }
            if step is not None:
                line["step"] = step
            if group.trajectories:  # and, for episodes of several samples, whose it is and the group's size
                line.update(episode_entry(group.trajectories[idx], rl_offset), **group.sample_fields(idx))
            if tokenizer is not None and idx == 0:
                line["response"] = tokenizer.decode(list(comp.output_ids), skip_special_tokens=True)
            lines.append(json.dumps(self._stamp(line)) + "\n")
        self._append(self._ledger, "".join(lines))  # one write: a group is recorded whole or not at all

    def log_admitted(
        self, prompt_id: str, stream_index: int, start_version: int, readmitted: bool, max_staleness: int | None = None
    ) -> None:
        """A prompt was admitted (``stream_index``: its position in the prompt stream; ``max_staleness``:
        the η in force for it, written when admission sets it per step, ``controller.adaptive``)."""
        line = {
            "prompt_id": prompt_id,
            "sample_idx": None,
            "status": "admitted",
            "stream_index": stream_index,
            "start_version": start_version,
            "readmitted": readmitted,
        }
        if max_staleness is not None:
            line["max_staleness"] = max_staleness
        self._write_ledger(line)

    def log_resumed(self, step: int, readmit: int) -> None:
        """A marker: the run resumed here, at training step ``step``, with ``readmit`` prompts to
        admit again (the staleness counters restart from the groups trained so far)."""
        self._write_ledger(
            {"prompt_id": None, "sample_idx": None, "status": "resumed", "step": step, "readmit": readmit}
        )

    def log_prompt_dropped(self, prompt_id: str, start_version: int, status: str, reason: str) -> None:
        """A prompt that ends without samples: ``in_flight`` at the end of a run, or
        ``engine_failure`` after its retries."""
        self._write_ledger(
            {
                "prompt_id": prompt_id,
                "sample_idx": None,
                "status": status,
                "start_version": start_version,
                "trained_step": None,
                "dropped": reason,
            }
        )

    def log_in_flight(self, prompt_id: str, start_version: int, reason: str = "in_flight_at_end") -> None:
        """A prompt admitted but not finished when the run ended (not written once a write has failed,
        like ``unused`` lines)."""
        if self._failed is None:
            self.log_prompt_dropped(prompt_id, start_version, "in_flight", reason)

    def log_timeline(self, sample: dict[str, Any]) -> None:
        """One activity sample (engine running requests, trainer busy, reward in flight, queues)."""
        self._append(self._timeline, json.dumps(self._stamp(sample)) + "\n")

    def log_snapshot(self, record: dict[str, Any]) -> None:
        """One saved policy snapshot (version, RL time, path) in ``snapshots.jsonl`` (cut back with the
        other files on resume, so a curve never mixes a lost branch in)."""
        self._append(self._snapshots, json.dumps(self._stamp(record)) + "\n")

    def write_summary(self, summary: dict[str, Any]) -> None:
        """``summary.json``, replaced atomically."""
        clean = self._stamp({k: _clean(v) for k, v in summary.items()})
        self._replace("summary.json", lambda tmp: tmp.write_text(json.dumps(clean, indent=2)))

    def close(self) -> None:
        self._metrics.close()
        self._ledger.close()
        self._timeline.close()
        self._snapshots.close()
        if self._tb is not None:
            self._tb.close()
