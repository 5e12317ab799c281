"""The run directory (DESIGN §7): resolved config, metrics, the ledger, summary, TensorBoard.

- ``config.yaml``: the resolved config of the run;
- ``metrics.jsonl``: one JSON line per training step;
- ``trajectories.jsonl`` (the ledger): a ``resumed`` marker where a resume continued the run;
  one ``admitted`` line per prompt when it is admitted (its
  index in the prompt stream, the version it started at, whether it is re-admitted after a
  resume), then one line per sample once its fate is known (trained, filtered, dropped as stale,
  skipped with a non-finite step) or one line per prompt when the engine failed it after its
  retries, and, at the end of a run, lines for groups still unused or in flight;
- ``timeline.jsonl``: a few samples a second of what each component is doing (for the report);
- ``summary.json``: written at the end;
- ``tb/``: TensorBoard events of the per-step metrics (when tensorboard is installed).
Lines are flushed as they are written so a killed run keeps everything up to the kill. On
resume the three jsonl files are cut back to the byte offsets saved with the checkpoint
(``offsets``); the cut tails are kept under ``resume/`` for forensics, never read again.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from asyncrl.config import Config, dump_yaml
from asyncrl.types import Group

JSONL_FILES = ("metrics.jsonl", "trajectories.jsonl", "timeline.jsonl")


def default_run_dir(root: str = "runs") -> Path:
    return Path(root) / time.strftime("%Y%m%d-%H%M%S")


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunDir:
    """Writers for one run directory (append-only; safe to reopen on resume)."""

    def __init__(
        self,
        path: str | Path,
        cfg: Config | None = None,
        *,
        tensorboard: bool = True,
        truncate: dict[str, int] | None = None,
        purge_step: int | None = None,
    ) -> None:
        """``truncate``: resume — cut each jsonl file back to this byte offset (missing names: to 0)
        first; ``purge_step``: TensorBoard drops its events from this step on (resume)."""
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        if cfg is not None:
            dump_yaml(cfg, self.path / "config.yaml")
        if truncate is not None:
            for name in JSONL_FILES:
                self._truncate(name, int(truncate.get(name, 0)))
        self._metrics = open(self.path / "metrics.jsonl", "a", encoding="utf-8")
        self._ledger = open(self.path / "trajectories.jsonl", "a", encoding="utf-8")
        self._timeline = open(self.path / "timeline.jsonl", "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.path / "tb"), purge_step=purge_step)
            except Exception:  # tensorboard missing or broken: metrics.jsonl still has everything
                self._tb = None

    def _truncate(self, name: str, offset: int) -> None:
        """Cut ``name`` back to ``offset`` bytes; the tail goes to ``resume/<name>.<time>``."""
        path = self.path / name
        if not path.exists() or path.stat().st_size <= offset:
            return
        with open(path, "r+b") as fh:
            fh.seek(offset)
            tail = fh.read()
            fh.seek(offset)
            fh.truncate()
        archive = self.path / "resume"
        archive.mkdir(exist_ok=True)
        (archive / f"{name}.cut-{time.strftime('%Y%m%d-%H%M%S')}-{offset}").write_bytes(tail)

    def offsets(self) -> dict[str, int]:
        """Byte length of each jsonl file now (every line written so far is flushed)."""
        return {
            "metrics.jsonl": self._metrics.tell(),
            "trajectories.jsonl": self._ledger.tell(),
            "timeline.jsonl": self._timeline.tell(),
        }

    def _write_ledger(self, line: dict[str, Any]) -> None:
        self._ledger.write(json.dumps(line) + "\n")
        self._ledger.flush()

    def log_step(self, record: dict[str, Any]) -> None:
        """Append one step's metrics (and mirror the numeric ones to TensorBoard)."""
        clean = {k: _clean(v) for k, v in record.items()}
        self._metrics.write(json.dumps(clean) + "\n")
        self._metrics.flush()
        if self._tb is not None:
            step = int(record.get("step", 0))
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    self._tb.add_scalar(key, value, step)

    def log_group(
        self,
        group: Group,
        *,
        trained_step: int | None,
        dropped: str | None,
        status: str,
        tokenizer: Any | None = None,
        step: int | None = None,
    ) -> None:
        """One ledger line per sample of ``group``. ``status``: trained | filtered | stale |
        skipped | unused; ``dropped`` is the reason when it was not trained; ``step`` the training
        step at which a stale or skipped group met its fate."""
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
            if tokenizer is not None and idx == 0:
                line["response"] = tokenizer.decode(list(comp.output_ids), skip_special_tokens=True)
            self._ledger.write(json.dumps(line) + "\n")
        self._ledger.flush()

    def log_admitted(self, prompt_id: str, stream_index: int, start_version: int, readmitted: bool) -> None:
        """A prompt was admitted (``stream_index``: its position in the prompt stream)."""
        self._write_ledger(
            {
                "prompt_id": prompt_id,
                "sample_idx": None,
                "status": "admitted",
                "stream_index": stream_index,
                "start_version": start_version,
                "readmitted": readmitted,
            }
        )

    def log_resumed(self, step: int, readmit: int) -> None:
        """A marker: the run resumed here, at training step ``step``, with ``readmit`` prompts to
        admit again (the staleness counters restart from the groups trained so far)."""
        self._write_ledger({"prompt_id": None, "sample_idx": None, "status": "resumed", "step": step,
                            "readmit": readmit})  # fmt: skip

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

    def log_in_flight(self, prompt_id: str, start_version: int) -> None:
        """A prompt admitted but not finished when the run ended."""
        self.log_prompt_dropped(prompt_id, start_version, "in_flight", "in_flight_at_end")

    def log_timeline(self, sample: dict[str, Any]) -> None:
        """One activity sample (engine running requests, trainer busy, reward in flight, queues)."""
        self._timeline.write(json.dumps(sample) + "\n")
        self._timeline.flush()

    def write_summary(self, summary: dict[str, Any]) -> None:
        (self.path / "summary.json").write_text(json.dumps({k: _clean(v) for k, v in summary.items()}, indent=2))

    def close(self) -> None:
        self._metrics.close()
        self._ledger.close()
        self._timeline.close()
        if self._tb is not None:
            self._tb.close()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All complete JSON lines of a file (a torn last line from a kill is skipped)."""
    out = []
    p = Path(path)
    if not p.exists():
        return out
    for raw in p.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(raw))
        except json.JSONDecodeError:
            continue
    return out
