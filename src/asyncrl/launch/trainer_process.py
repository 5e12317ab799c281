"""The trainer in its own process, as a ``trainer.api.PolicyTrainer`` (``TrainerProcess``).

Why: the engine's decode loop and the trainer's step both run Python between their torch ops; as
two threads of one process they take turns on the GIL. Measured on the 2-core CPU box with the
tiny policy: a training step alone 1.2 s; with the engine decoding in another thread 2.4 s while
the engine fell from 11.6k to 5.7k tokens/s (no better than taking turns); with the trainer in
its own process 1.2 s and 9.5k tokens/s. So the local launcher runs the trainer here by default
(``controller.trainer_process``).

The child builds the ``Trainer`` itself (``launch.stages``, from the model directory: the same
initial weights the engine loads in the parent) and serves one call at a time over a pipe:
``train_step``, ``export_weights``, ``save_checkpoint``, ``load_checkpoint``, ``save_pretrained``. A call that
raises in the child raises ``TrainerProcessError`` (with the child's traceback) in the parent, but a
full disk (``storage.DiskFull``, e.g. while saving a checkpoint) is raised as itself: its message is
the one the user must see.
The child ignores SIGINT/SIGTERM (the parent decides when to stop, and a terminal's Ctrl-C
reaches the whole process group) and exits when the parent goes away (its pipe closes), which
covers a SIGKILL of the parent.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import threading
import traceback
from pathlib import Path
from typing import Any

from asyncrl.choices import WeightTransport
from asyncrl.config import Config
from asyncrl.launch.stages import build_trainer, init_process, load_model
from asyncrl.storage import DiskFull
from asyncrl.trainer.api import TrainStepResult
from asyncrl.types import TrainBatch, WeightUpdate

__all__ = ["TrainerProcess", "TrainerProcessError"]


class TrainerProcessError(RuntimeError):
    """A trainer call failed in the child process (the message carries its traceback)."""


def _serve(conn: Any, model_dir: str, cfg: Config) -> None:
    """Child main: build the trainer, then answer calls until the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    init_process(cfg)
    try:
        model, tokenizer = load_model(cfg, model_dir)
        trainer = build_trainer(cfg, model, tokenizer)
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ok", trainer.version))
    while True:
        try:
            name, args = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if name == "close":
            conn.send(("ok", None))
            return
        try:
            match name:
                case "train_step":
                    value: Any = trainer.train_step(*args)
                case "export_weights":
                    update = trainer.export_weights(*args)
                    if update.tensors is not None:  # plain CPU copies: they cross the pipe pickled
                        update = type(update)(
                            version=update.version,
                            tensors={k: v.detach().to("cpu").clone() for k, v in update.tensors.items()},
                        )
                    value = update
                case "save_checkpoint":
                    value = trainer.save_checkpoint(*args)
                case "load_checkpoint":
                    value = (trainer.load_checkpoint(*args), trainer.version)
                case "save_pretrained":
                    value = trainer.save_pretrained(*args)
                case other:
                    raise ValueError(f"unknown trainer call {other!r}")
            reply: tuple[str, Any] = ("ok", value)
        except DiskFull as exc:
            reply = ("disk_full", (exc.errno, str(exc), exc.filename))
        except Exception:
            reply = ("error", traceback.format_exc())
        try:
            conn.send(reply)
        except (BrokenPipeError, EOFError, OSError):  # the parent is gone
            return


class TrainerProcess:
    """A ``Trainer`` in a child process (see the module docstring); calls block until done."""

    def __init__(self, model_dir: str, cfg: Config) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, str(model_dir), cfg), name="asyncrl-trainer", daemon=True)
        self._proc.start()
        child.close()
        self._lock = threading.Lock()
        self._version: int | None = None  # known once the child is ready (it starts in the background)
        self.skipped_steps = 0

    @property
    def version(self) -> int:
        """The trainer's version (waits for the child to be ready the first time)."""
        if self._version is None:
            with self._lock:
                if self._version is None:
                    self._version = int(self._reply("starting the trainer"))
        return self._version

    def _reply(self, what: str) -> Any:
        try:
            status, value = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise TrainerProcessError(f"trainer process died while {what} (exit code {self._proc.exitcode})") from exc
        if status == "disk_full":
            raise DiskFull(*value)
        if status == "error":
            raise TrainerProcessError(f"trainer process failed while {what}:\n{value}")
        return value

    def _call(self, name: str, *args: Any) -> Any:
        self.version  # noqa: B018 - wait until the child is ready
        with self._lock:
            self._conn.send((name, args))
            return self._reply(name)

    def train_step(self, batch: TrainBatch) -> TrainStepResult:
        result = self._call("train_step", batch)
        self._version = result.version
        self.skipped_steps += 0 if result.applied else 1
        return result

    def export_weights(self, transport: WeightTransport | None = None) -> WeightUpdate:
        return self._call("export_weights", transport)

    def save_checkpoint(
        self, directory: str | Path, extra: dict[str, Any] | None = None, tokenizer: Any = None
    ) -> None:
        """The child saves its own tokenizer (``tokenizer`` is accepted for interface parity)."""
        self._call("save_checkpoint", str(directory), extra)

    def load_checkpoint(self, directory: str | Path) -> dict[str, Any] | None:
        extra, self._version = self._call("load_checkpoint", str(directory))
        return extra

    def save_pretrained(self, directory: str | Path, tokenizer: Any = None) -> None:
        self._call("save_pretrained", str(directory))

    def close(self) -> None:
        """Stop the child (idempotent)."""
        if self._proc.is_alive():
            try:
                self._call("close")
            except (TrainerProcessError, OSError, BrokenPipeError):
                pass
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.kill()
        self._conn.close()
