"""Code verification: run a program followed by its tests in a sandboxed Python subprocess.

This module owns the parent side of the sandbox (``sandbox.py`` is the inside): it prepares an
empty temporary directory and a scrubbed environment, starts the harness in a new session, feeds
it the job, enforces the wall-clock limit by killing the whole process group, caps the captured
stdout/stderr, cleans up every process of the run, removes the directory, and turns what happened
into a :class:`CodeResult`. It also turns a model's completion into a program
(:func:`build_program`). What is enforced where is listed in ``docs/reward.md``.

A run *passes* only if the tests ran to their end (the harness reports ``done`` with a per-run
nonce) and the process exited 0 within its limits. Failures of the machinery itself raise
:class:`SandboxError`; everything the program does is a verdict.
"""

from __future__ import annotations

import logging
import marshal
import math
import os
import pwd
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Literal

from asyncrl.reward import InfrastructureError

logger = logging.getLogger(__name__)

CodeStatus = Literal["passed", "failed", "timeout", "memory", "error"]

HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox.py")
_UID_BASE = 0x70000000  # above the ranges systemd hands to users, containers and dynamic users
_UID_SPAN = 1 << 24
_SIGXCPU = int(signal.SIGXCPU)
_SIGXFSZ = int(signal.SIGXFSZ)
_warned_modes: set[str] = set()
_last_mode: dict[bool, str] = {}


class SandboxError(InfrastructureError):
    """The sandbox itself failed (could not start, harness crashed during setup)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run (per process unless noted)."""

    memory_mb: int = 2048
    """Address-space limit (``RLIMIT_AS``)."""
    nproc: int = 64
    """Processes/threads of the run's uid (``RLIMIT_NPROC``; per run only where the uid is the
    run's own or a user namespace is used)."""
    fsize_mb: int = 16
    """Largest file a process may write (``RLIMIT_FSIZE``)."""
    nofile: int = 256
    """Open file descriptors (``RLIMIT_NOFILE``)."""
    tmpfs_mb: int = 64
    """Size of the private ``/tmp`` (holding the working directory) and ``/dev/shm`` when mount
    namespaces are available."""
    output_bytes: int = 64 * 1024
    """Captured bytes of stdout and of stderr each; the rest is read and dropped."""


@dataclass(frozen=True)
class CodeResult:
    """Outcome of one sandboxed run."""

    passed: bool
    status: CodeStatus
    """``passed``; ``failed`` (assertion, non-zero exit, exited before the tests finished, killed);
    ``timeout`` (wall clock or CPU limit); ``memory`` (MemoryError under the address-space limit);
    ``error`` (another exception, e.g. SyntaxError or NameError)."""
    exit_code: int | None
    """Exit status of the sandbox (128 + signal when the program was killed by one)."""
    duration_s: float
    stdout: str = ""
    stderr: str = ""
    detail: str = ""
    """Human-readable reason (exception type, phase, signal)."""
    isolation: dict[str, str] = field(default_factory=dict)
    """What the harness reported it could enforce (``mode``: ``ns-root``, ``ns-user``,
    ``rlimit-root``, ``rlimit-user``; ``net``; ``fs_ro``; ``uid``; leftovers)."""
    output_truncated: bool = False
    run_id: str = ""
    """``<pid of the caller>-<random>``. Every process of the run carries
    ``ASYNCRL_SANDBOX_RUN=<run_id>`` in its initial environment (for logs, and to check that
    nothing outlived the run)."""


def _fresh_uid() -> int:
    while True:
        uid = _UID_BASE + secrets.randbelow(_UID_SPAN)
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid


def _scrubbed_env(workdir: str, run_id: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
        # one thread per math library: RLIMIT_NPROC counts threads, and tests need no more
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "ASYNCRL_SANDBOX": "1",
        "ASYNCRL_SANDBOX_RUN": run_id,
    }


def run_code_tests(
    program: str,
    test_code: str,
    *,
    timeout_s: float = 10.0,
    limits: SandboxLimits | None = None,
    isolate: bool = True,
    require_isolation: bool = False,
) -> CodeResult:
    """Run ``program`` then ``test_code`` (same globals, like one file) in a sandboxed Python.

    ``timeout_s`` bounds the wall clock of the whole run, interpreter start included; the CPU
    limit is ``ceil(timeout_s) + 1`` s per process. ``isolate=False`` skips the namespaces (tests
    only); ``require_isolation=True`` raises :class:`SandboxError` where namespaces are not
    available instead of running with rlimits only. Blocking; safe to call from threads.
    """
    limits = limits or SandboxLimits()
    start = time.monotonic()
    run_id = f"{os.getpid()}-{secrets.token_hex(6)}"
    nonce = secrets.token_hex(16)
    run_uid = _fresh_uid() if os.geteuid() == 0 else None
    workdir = tempfile.mkdtemp(prefix="asyncrl-sbx-")
    status_r, status_w = os.pipe()
    job = {
        "program": program,
        "tests": test_code,
        "nonce": nonce,
        "status_fd": status_w,
        "parent_pid": os.getpid(),
        "run_uid": run_uid,
        "host_workdir": workdir,
        "isolate": isolate,
        "require_isolation": require_isolation,
        "cpu_s": math.ceil(timeout_s) + 1,
        "memory_mb": limits.memory_mb,
        "nproc": limits.nproc,
        "nproc_shared_uid": _nproc_for_shared_uid(limits.nproc) if _may_share_uid(run_uid, isolate) else None,
        "fsize_mb": limits.fsize_mb,
        "nofile": limits.nofile,
        "tmpfs_mb": limits.tmpfs_mb,
    }
    proc: subprocess.Popen[bytes] | None = None
    isolation: dict[str, str] = {}
    status_b = b""
    try:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-B", "-X", "utf8", HARNESS],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env=_scrubbed_env(workdir, run_id),
                pass_fds=(status_w,),
                start_new_session=True,
            )
        except OSError as e:
            raise SandboxError(f"cannot start the sandbox: {e}") from e
        finally:
            os.close(status_w)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        try:
            proc.stdin.write(marshal.dumps(job))
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the harness died early; reported below from its exit status
        deadline = start + timeout_s
        outputs, truncated, timed_out = _collect(proc, status_r, deadline, limits.output_bytes)
        stdout_b, stderr_b, status_b = outputs
        status_lines = status_b.decode("utf-8", "replace").splitlines()
        isolation = _parse_isolation(status_lines)
    finally:
        if proc is not None:
            _cleanup(proc, status_b, run_id, run_uid, isolation)
        os.close(status_r)
        _remove_tree(workdir)
    duration = time.monotonic() - start
    exit_code = proc.returncode
    stdout = stdout_b.decode("utf-8", "replace")
    stderr = stderr_b.decode("utf-8", "replace")
    mode = isolation.get("mode", "")
    if mode:
        _last_mode[isolate] = mode
    if mode and mode not in _warned_modes and not mode.startswith("ns-"):
        _warned_modes.add(mode)
        logger.warning("code sandbox runs without namespaces (%s): %s", mode, isolation)
    status, detail = _classify(status_lines, nonce, exit_code, timed_out, stderr, timeout_s)
    return CodeResult(
        passed=status == "passed",
        status=status,
        exit_code=exit_code,
        duration_s=duration,
        stdout=stdout,
        stderr=stderr,
        detail=detail,
        isolation=isolation,
        output_truncated=truncated,
        run_id=run_id,
    )


def _collect(
    proc: subprocess.Popen[bytes], status_r: int, deadline: float, cap: int
) -> tuple[tuple[bytes, bytes, bytes], bool, bool]:
    """Read stdout, stderr and the status pipe until they close, the process is gone for a
    moment, or the deadline passes (then kill the process group). Keeps at most ``cap`` bytes."""
    assert proc.stdout is not None and proc.stderr is not None
    fds = {proc.stdout.fileno(): 0, proc.stderr.fileno(): 1, status_r: 2}
    bufs = [bytearray(), bytearray(), bytearray()]
    truncated = False
    timed_out = False
    exited_at: float | None = None
    with selectors.DefaultSelector() as sel:
        for fd in fds:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > 0.5:
                break  # something outside the sandbox's process tree holds the pipes
            if now >= deadline:
                timed_out = True
                _terminate(proc, bytes(bufs[2]))
                break
            timeout = min(deadline - now, 0.05 if exited_at is not None else 0.2)
            for key, _ in sel.select(timeout=timeout):
                try:
                    data = os.read(key.fd, 65536)
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(key.fd)
                    continue
                buf = bufs[fds[key.fd]]
                room = cap - len(buf)
                if room > 0:
                    buf += data[:room]
                if len(data) > room:
                    truncated = truncated or fds[key.fd] != 2
    return (bytes(bufs[0]), bytes(bufs[1]), bytes(bufs[2])), truncated, timed_out


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _terminate(proc: subprocess.Popen[bytes], status: bytes) -> None:
    """Kill a run. With namespaces, kill the PID namespace's init first: the kernel then kills
    every process in the namespace, and the harness reaps the init and exits only once the
    namespace is empty. Then kill the process group (the harness, and everything outside
    namespaces that did not leave the group)."""
    init_pid = _reported_pid(status, "init")
    if init_pid is not None and proc.poll() is None:
        try:
            os.kill(init_pid, signal.SIGKILL)
            proc.wait(timeout=3)
        except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
            pass
    _killpg(proc.pid)


def _reported_pid(status: bytes, kind: str) -> int | None:
    """The pid the harness reported before any untrusted code ran (its first such line)."""
    for line in status.decode("utf-8", "replace").splitlines():
        if line == "ready":
            return None
        if line.startswith(kind + " ") and line[len(kind) + 1 :].isdigit():
            return int(line[len(kind) + 1 :])
    return None


def _cleanup(
    proc: subprocess.Popen[bytes], status: bytes, run_id: str, run_uid: int | None, isolation: dict[str, str]
) -> None:
    """Kill everything the run may have left: the PID namespace and process group, and outside
    namespaces its uid (as root) and every process carrying its environment marker."""
    _terminate(proc, status)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        logger.error("sandbox process %d did not die after SIGKILL", proc.pid)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    if isolation.get("mode", "").startswith("ns-"):
        return  # the PID namespace died with its init: nothing can be left
    if run_uid is not None and isolation.get("uid") == str(run_uid):
        _kill_uid(run_uid)
    _kill_marked(run_id)


def _remove_tree(path: str) -> None:
    """Remove a run's directory even if the program took permissions away from its files."""
    try:
        os.chmod(path, 0o700)
        for root, dirs, _ in os.walk(path):
            for d in dirs:
                os.chmod(os.path.join(root, d), 0o700, follow_symlinks=False)
    except OSError:
        pass
    shutil.rmtree(path, ignore_errors=True)


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid`` at once (kill(-1) from a child running as that uid)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _kill_marked(run_id: str) -> None:
    marker = f"ASYNCRL_SANDBOX_RUN={run_id}".encode()
    for _ in range(20):
        found = False
        for pid in _pids():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if marker not in f.read().split(b"\0"):
                        continue
            except OSError:
                continue
            found = True
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not found:
            return
        time.sleep(0.01)


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _may_share_uid(run_uid: int | None, isolate: bool) -> bool:
    """Whether the run may end up counting processes against the caller's own uid: not as root
    (fresh uid), and not when the last run here got a user namespace."""
    return run_uid is None and _last_mode.get(isolate, "") != "ns-user"


def _nproc_for_shared_uid(nproc: int) -> int:
    """Without a uid or user namespace of its own, RLIMIT_NPROC counts all tasks of the user:
    allow the tasks that exist now plus ``nproc``."""
    uid = os.getuid()
    tasks = 0
    for pid in _pids():
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                tasks += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue
    return tasks + nproc


def _parse_isolation(lines: list[str]) -> dict[str, str]:
    for line in lines:
        if line.startswith("iso "):
            return dict(part.split("=", 1) for part in line[4:].split() if "=" in part)
    return {}


def _classify(
    lines: list[str], nonce: str, exit_code: int | None, timed_out: bool, stderr: str, timeout_s: float
) -> tuple[CodeStatus, str]:
    """Turn the harness's status lines and the exit status into a verdict."""
    if timed_out:
        return "timeout", f"wall clock limit of {timeout_s:g}s"
    ready = False
    outcome: str | None = None
    done = False
    for line in lines:
        if not ready:
            if line.startswith("setup_error"):
                raise SandboxError(f"sandbox setup failed: {line}")
            ready = line == "ready"
            continue
        if line == f"done {nonce}":
            done = True
        elif outcome is None and line.split(" ", 1)[0] in ("exc", "memory", "exit"):
            outcome = line
    if not ready:
        raise SandboxError(f"sandbox harness failed before the program ran (exit {exit_code}): {stderr[-500:]}")
    if done and exit_code == 0:
        return "passed", ""
    signum = exit_code - 128 if exit_code is not None and exit_code > 128 else None
    if signum == _SIGXCPU:
        return "timeout", "CPU time limit"
    if outcome is not None:
        kind, phase, *rest = outcome.split(" ") + [""]
        if kind == "memory":
            return "memory", f"MemoryError in the {phase}"
        if kind == "exit":
            what = "before the tests ran" if phase == "program" else "in the tests"
            return "failed", f"exit({rest[0]}) {what}"
        name = rest[0]
        if name == "AssertionError":
            return "failed", f"AssertionError in the {phase}"
        if name == "MemoryError":
            return "memory", f"MemoryError in the {phase}"
        return "error", f"{name} in the {phase}"
    if "MemoryError" in stderr[-2000:]:
        return "memory", "MemoryError"
    if signum == _SIGXFSZ:
        return "failed", "file size limit exceeded"
    if signum is not None:
        return "failed", f"killed by signal {signum}"
    if done:
        return "failed", f"tests finished but the process exited {exit_code}"
    return "failed", f"exited {exit_code} before the tests finished"


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The code in a completion: the last fenced Python block (preferring one that defines
    ``entry_point``), or the whole text when it has no fences."""
    blocks = [body for lang, body in _FENCE.findall(text) if lang.lower() in ("", "python", "py", "python3")]
    if not blocks:
        return text
    if entry_point:
        defining = [b for b in blocks if _defines(b, entry_point)]
        if defining:
            return defining[-1]
    return blocks[-1]


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.M) is not None


def build_program(completion: str, *, prefix: str = "", entry_point: str | None = None) -> str:
    """Turn a model completion into a program.

    Without ``entry_point`` this is :func:`extract_code`. With HumanEval-style ``prefix`` (the
    prompt: imports, helpers, the signature and docstring) and ``entry_point``: a completion that
    defines the function runs after the prefix (whose docstring-only function it replaces; the
    imports and helpers stay); otherwise it is a body continuing the prefix.
    """
    code = extract_code(completion, entry_point)
    if not entry_point or not prefix:
        return code
    if _defines(code, entry_point):
        return f"{prefix.rstrip()}\n\n\n{code}"
    return prefix + code
