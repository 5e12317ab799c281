"""The reward worker processes: their entry point, their main loop, and the parent's handle.

A worker is a fresh interpreter started with ``subprocess`` and connected by a socketpair; it
runs verifier functions from :mod:`asyncrl.reward.verifiers` and dies with its parent.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import math
import multiprocessing.connection
import os
import signal
import socket
import subprocess
import sys
from typing import Any

from asyncrl.reward import InfrastructureError, VerifierTimeout
from asyncrl.reward.verifiers import Request, WorkerFn, resolve_verifier  # noqa: F401

# ----------------------------------------------------------------------------------- worker side

logger = logging.getLogger(__name__)


def _set_parent_death_signal() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker_main(conn: Any, preload: tuple[str, ...], parent_pid: int) -> None:
    """Loop of one worker process: receive (function, request), reply with one message."""
    _set_parent_death_signal()
    if os.getppid() != parent_pid:
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if "math" in preload:
        try:
            from asyncrl.reward.math import is_equivalent

            is_equivalent("\\frac{1}{2}", "0.5")  # import math-verify and sympy, build the parser
        except Exception:  # noqa: BLE001 - the first real request reports the problem
            logger.exception("reward worker could not preload math-verify")
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        try:
            fn, req = message
            reward, note = fn(req)
            reward = float(reward)
            if not math.isfinite(reward):
                raise ValueError(f"verifier returned a non-finite reward {reward!r}")
            reply: tuple[Any, ...] = ("ok", reward, note)
        except VerifierTimeout as e:
            reply = ("timeout", str(e))
        except InfrastructureError as e:
            reply = ("infra", f"{type(e).__name__}: {e}"[:500])
        except BaseException as e:  # noqa: BLE001 - anything else is the verifier's error
            reply = ("error", f"{type(e).__name__}: {e}"[:500])
        try:
            conn.send(reply)
        except (OSError, ValueError):
            return


# ----------------------------------------------------------------------------------- parent side


class _Worker:
    """One worker: a fresh interpreter (spawn semantics: nothing inherited from the parent's
    memory or threads, and unlike multiprocessing's spawn it does not re-import the caller's
    ``__main__``), connected by a socketpair carrying pickled messages."""

    def __init__(self, preload: tuple[str, ...]) -> None:
        parent_sock, child_sock = socket.socketpair()
        self.conn = multiprocessing.connection.Connection(parent_sock.detach())
        self._child_fd = child_sock.detach()
        self._preload = preload
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER_BOOT, str(self._child_fd)],
                pass_fds=(self._child_fd,),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        finally:
            os.close(self._child_fd)
        self.conn.send({"sys_path": list(sys.path), "preload": self._preload, "parent_pid": os.getpid()})

    def wait_exit(self, timeout: float) -> int | None:
        """Exit code of a worker that closed its end (None if it is still running)."""
        try:
            return self.proc.wait(timeout=timeout) if self.proc is not None else None
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL the worker (its sandboxes die with it: they carry a parent-death signal)."""
        if self.proc is not None:
            try:
                self.proc.kill()
                self.proc.wait(timeout=1)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.conn.close()

    def stop(self) -> None:
        """Ask an idle worker to exit, then make sure it did."""
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


_WORKER_BOOT = "import sys; from asyncrl.reward.worker import _worker_entry; _worker_entry(int(sys.argv[1]))"


def _worker_entry(fd: int) -> None:
    """Entry point of a worker interpreter: take the parent's sys.path, then serve requests."""
    conn = multiprocessing.connection.Connection(fd)
    try:
        init = conn.recv()
    except (EOFError, OSError):
        return
    sys.path[:] = init["sys_path"]
    _worker_main(conn, tuple(init["preload"]), int(init["parent_pid"]))


async def _recv(conn: Any, timeout: float) -> Any:
    """Receive one message, waiting at most ``timeout`` s (TimeoutError) without blocking the loop."""
    loop = asyncio.get_running_loop()
    if not conn.poll():
        ready = loop.create_future()
        fd = conn.fileno()
        loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
        try:
            await asyncio.wait_for(ready, timeout)
        finally:
            loop.remove_reader(fd)
    return conn.recv()


class _LeaderGone(Exception):
    """The request an identical one was waiting for was cancelled; compute it yourself."""
