"""The code sandbox: verdicts, limits, isolation, cleanup, hostile programs."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncrl.reward.code import SandboxError, SandboxLimits, build_program, extract_code, run_code_tests
from tests.repo_paths import REPO

from .hostile import HOSTILE, TESTS, sandbox_processes

TIMEOUT = 2.0
HANG_S = 20.0
"""Slack over a run's wall clock before a test calls it hung: a loaded 2-core machine may take seconds to
start an interpreter and to kill and reap a sandbox, so this guards against a run that is never stopped
(``setsid_daemon`` sleeps 60 s), not against a slow one. Whether a run was stopped at its wall clock is
checked by its verdict and by the processes it leaves (none), which the machine's load does not change."""
SRC = str(REPO / "src")


@pytest.fixture
def outside() -> Iterator[Path]:
    """A world-writable directory, outside the sandbox's private /tmp where it can be (under the
    repo's ignored .cache/), so only the read-only mounts (or file permissions) can stop a write
    to it. A read-only checkout falls back to the system temp directory (hidden by the private
    /tmp instead; the tests accept either)."""
    try:
        base = REPO / ".cache"
        base.mkdir(exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix="reward-outside-", dir=base))
    except OSError:  # a read-only source tree
        path = Path(tempfile.mkdtemp(prefix="reward-outside-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _world_traversable(path: Path) -> bool:
    """Whether a stranger uid can reach ``path`` (every directory up to it is o+x)."""
    return all(p.stat().st_mode & 0o001 for p in (path, *path.parents))


@pytest.fixture
def world_readable_copy() -> Iterator[Path]:
    """A fresh directory that any uid can read, holding a copy of the ``asyncrl`` package.

    The unprivileged-user test runs Python as another uid, which may not be able to read the
    checkout (a clone into an owner-only directory, e.g. ``mktemp -d`` or a home directory): it
    imports this copy instead. The directory is made here, under a temp root every uid can
    traverse, and removed afterwards; the sandbox itself is unchanged."""
    roots = [Path(tempfile.gettempdir()), Path("/tmp"), Path("/var/tmp")]
    root = next((r for r in roots if r.is_dir() and _world_traversable(r.resolve())), None)
    if root is None:
        pytest.skip("no temp directory that another uid can traverse")
    path = Path(tempfile.mkdtemp(prefix="asyncrl-unpriv-", dir=root))
    try:
        path.chmod(0o755)
        shutil.copytree(Path(SRC) / "asyncrl", path / "asyncrl", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for sub in (path / "asyncrl", *(path / "asyncrl").rglob("*")):
            sub.chmod(0o755 if sub.is_dir() else 0o644)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _isolated() -> bool:
    return run_code_tests("pass", "", timeout_s=10).isolation.get("mode", "").startswith("ns-")


ISOLATED = _isolated()
needs_ns = pytest.mark.skipif(not ISOLATED, reason="no mount/network/PID namespaces on this host (see docs/reward.md)")


@pytest.mark.parametrize(
    ("program", "tests", "status"),
    [
        ("def f(x):\n    return x + 1\n", "assert f(1) == 2\n", "passed"),
        ("def f(x):\n    return x\n", "assert f(1) == 2\n", "failed"),
        ("def f(x) return x\n", "assert f(1) == 2\n", "error"),
        ("def f(x):\n    return undefined\n", "assert f(1) == 2\n", "error"),
        ("x = 1\n", "import sys\nsys.exit(0)\n", "passed"),  # e.g. unittest.main() on success
        ("x = 1\n", "import sys\nsys.exit(3)\n", "failed"),
        ("import sys\nsys.exit(0)\n", "assert False\n", "failed"),
        ("import os\nos._exit(0)\n", "assert False\n", "failed"),
        ("import atexit, os\natexit.register(lambda: os._exit(0))\n", "assert False\n", "failed"),
        ("x = bytearray(20 * 1024 ** 3)\n", "", "memory"),
        ("while True:\n    pass\n", "", "timeout"),
    ],
)
def test_verdicts(program: str, tests: str, status: str) -> None:
    # only the endless loop needs the short wall clock; the others get room for a slow interpreter start
    # on a loaded box (at load ~15 the 20 GiB allocation's sandbox took over 2 s to start: "timeout")
    timeout_s = TIMEOUT if status == "timeout" else 30.0
    start = time.monotonic()
    result = run_code_tests(program, tests, timeout_s=timeout_s)
    assert result.status == status, (result.detail, result.stderr[-500:])
    assert result.passed == (status == "passed")
    if status == "timeout":  # the endless loop: killed at its wall clock (the CPU limit, 3 s, comes later)
        assert result.detail == f"wall clock limit of {TIMEOUT:g}s", result.detail
    assert sandbox_processes(run_id=result.run_id) == []  # and nothing left running
    assert time.monotonic() - start < timeout_s + HANG_S  # a hang guard, not a speed limit


def test_program_and_tests_share_globals_and_report_output() -> None:
    result = run_code_tests("import math\nVALUE = math.sqrt(16)\nprint('hello')\n", "assert VALUE == 4.0\n")
    assert result.passed
    assert result.stdout == "hello\n"
    assert result.exit_code == 0


def test_empty_workdir_and_scrubbed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCRL_SECRET_TOKEN", "do-not-leak")
    program = (
        "import os, json\n"
        "print(json.dumps({'cwd': os.getcwd(), 'files': os.listdir('.'), 'env': sorted(os.environ)}))\n"
    )
    result = run_code_tests(program, "")
    assert result.passed, result.stderr
    seen = json.loads(result.stdout)
    assert seen["files"] == []
    assert "ASYNCRL_SECRET_TOKEN" not in seen["env"]
    allowed = {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "ASYNCRL_SANDBOX", "ASYNCRL_SANDBOX_RUN"}
    allowed |= {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}
    assert set(seen["env"]) <= allowed


def test_each_run_gets_its_own_directory() -> None:
    first = run_code_tests("open('state.txt', 'w').write('1')\n", "")
    second = run_code_tests("import os\nassert not os.path.exists('state.txt')\n", "")
    assert first.passed and second.passed, second.stderr


def test_output_is_capped() -> None:
    limits = SandboxLimits(output_bytes=1000)
    result = run_code_tests("print('x' * 100000)\nimport sys\nsys.stderr.write('y' * 5000)\n", "", limits=limits)
    assert result.passed
    assert len(result.stdout) == 1000 and len(result.stderr) == 1000
    assert result.output_truncated


def test_limits_file_size_and_processes() -> None:
    limits = SandboxLimits(fsize_mb=1, nproc=8)
    big = run_code_tests("open('f', 'wb').write(b'x' * (2 << 20))\n", "", limits=limits)
    assert not big.passed
    forks = (
        "import os, time\nn = 0\nfor _ in range(50):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(5)\n        os._exit(0)\n"
        "    n += 1\nprint(n)\n"
    )
    result = run_code_tests(forks, "", limits=limits, timeout_s=30)  # room for a loaded machine
    assert result.passed, result.stderr
    assert int(result.stdout) < 8
    assert sandbox_processes(run_id=result.run_id) == []


def test_isolation_is_reported() -> None:
    info = run_code_tests("pass", "").isolation
    assert info["mode"] in ("ns-root", "ns-user", "rlimit-root", "rlimit-user")
    if os.geteuid() == 0 and info["mode"] == "ns-root":
        assert int(info["uid"]) != 0


@needs_ns
def test_no_capabilities_and_unprivileged_uid() -> None:
    program = (
        "import os\n"
        "caps = [l for l in open('/proc/self/status') if l.startswith('CapEff')][0].split()[1]\n"
        "assert int(caps, 16) == 0, caps\n"
        "assert os.getuid() != 0\n"
        "assert os.getppid() == 1  # the namespace's init, already unprivileged when we start\n"
        "init = [l for l in open('/proc/1/status') if l.startswith('CapEff')][0].split()[1]\n"
        "assert int(init, 16) == 0, init\n"
    )
    result = run_code_tests(program, "")
    assert result.passed, result.stderr


@needs_ns
def test_filesystem_outside_is_read_only(outside: Path) -> None:
    program = f"open({str(outside / 'escaped')!r}, 'w').write('x')\n"
    result = run_code_tests(program, "")
    # Read-only mount where the directory is visible; where the checkout lives under /tmp (a CI
    # clone), the sandbox's private /tmp hides it instead. Either way nothing escapes.
    assert result.status == "error"
    assert any(m in result.stderr for m in ("Read-only file system", "No such file or directory")), result.stderr
    assert not (outside / "escaped").exists()


def test_require_isolation_raises_where_unavailable() -> None:
    if ISOLATED:
        assert run_code_tests("pass", "", require_isolation=True).passed
    else:
        with pytest.raises(SandboxError):
            run_code_tests("pass", "", require_isolation=True)


def test_threads_can_run_sandboxes_concurrently() -> None:
    results: list[bool] = []

    def work(i: int) -> None:
        results.append(run_code_tests(f"def f():\n    return {i}\n", f"assert f() == {i}\n").passed)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 4


class _Listener:
    """A TCP listener on the host's loopback that records whether anything connected."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.thread.join()
        self.sock.close()


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_program(name: str, outside: Path) -> None:
    listener = _Listener()
    program = HOSTILE[name].replace("{outside}", str(outside / "escaped")).replace("{port}", str(listener.port))
    try:
        start = time.monotonic()
        result = run_code_tests(program, TESTS, timeout_s=TIMEOUT)
        elapsed = time.monotonic() - start
    finally:
        listener.close()
    assert not result.passed
    assert result.status in ("failed", "timeout", "memory", "error")
    assert elapsed < TIMEOUT + HANG_S, f"{name} took {elapsed:.1f}s"
    assert sandbox_processes(run_id=result.run_id) == [], f"{name} left processes behind"
    if result.isolation.get("mode", "").startswith("ns-"):
        assert listener.connections == 0, "the sandbox reached the host's network"
        assert list(outside.iterdir()) == [], "the sandbox wrote outside its directory"
    assert len(result.stdout) <= SandboxLimits().output_bytes


def test_without_namespaces_cleanup_still_kills_escaped_daemons() -> None:
    program = HOSTILE["setsid_daemon"]
    result = run_code_tests(program, TESTS, timeout_s=TIMEOUT, isolate=False)
    assert not result.passed
    assert result.isolation["mode"].startswith("rlimit-")
    assert sandbox_processes(run_id=result.run_id) == []


def _setpriv_python() -> list[str] | None:
    """A command running the system Python as an unprivileged user (root hosts only)."""
    python = shutil.which("python3", path="/usr/bin:/bin")
    if os.geteuid() != 0 or shutil.which("setpriv") is None or python is None:
        return None
    check = subprocess.run([python, "-c", "import sys; print(sys.version_info >= (3, 10))"], capture_output=True)
    if check.stdout.strip() != b"True":
        return None
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python]


@pytest.mark.skipif(_setpriv_python() is None, reason="needs root, setpriv and a system python3 >= 3.10")
def test_unprivileged_user_namespace_mode(world_readable_copy: Path) -> None:
    """As an ordinary user the sandbox uses a user namespace: files the user may write stay
    untouched, the network is gone, and killing the parent does nothing. The user imports
    asyncrl from a world-readable copy (the checkout itself may be owner-only) and owns a
    directory it could write to without the sandbox."""
    target = world_readable_copy / "users_own_dir"
    target.mkdir()
    os.chown(target, 65534, 65534)
    script = (
        "import sys, json\n"
        f"sys.path.insert(0, {str(world_readable_copy)!r})\n"
        "import asyncrl.reward.code as code\n"
        f"assert code.__file__.startswith({str(world_readable_copy)!r}), code.__file__\n"
        "from asyncrl.reward.code import run_code_tests\n"
        f"w = run_code_tests(\"open({str(target / 'x')!r}, 'w').write('x')\", '')\n"
        "n = run_code_tests(\"import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)\", '')\n"
        "k = run_code_tests(\"import os; os.kill(os.getppid(), 9)\", 'assert True')\n"
        "ok = run_code_tests('def f(): return 1', 'assert f() == 1')\n"
        "runs = (w, n, k, ok)\n"
        "print(json.dumps([r.isolation.get('mode') for r in runs] + [r.status for r in runs]))\n"
    )
    cmd = _setpriv_python()
    assert cmd is not None
    out = subprocess.run([*cmd, "-c", script], capture_output=True, text=True, timeout=60, cwd=world_readable_copy)
    assert out.returncode == 0, out.stderr
    modes_and_statuses = json.loads(out.stdout.strip().splitlines()[-1])
    modes, statuses = modes_and_statuses[:4], modes_and_statuses[4:]
    if modes[0] != "ns-user":
        pytest.skip(f"unprivileged user namespaces unavailable here (mode {modes[0]})")
    assert statuses == ["error", "error", "passed", "passed"]
    assert not (target / "x").exists()


def test_extract_code_and_build_program() -> None:
    fenced = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\nand a usage example:\n```\nadd(1, 2)\n```"
    assert extract_code(fenced, "add").startswith("def add")
    assert extract_code("no fences here") == "no fences here"
    prompt = (
        'from typing import List\n\n\ndef helper(x):\n    return x\n\n\ndef add(a: List[int]) -> int:\n    """Sum."""\n'
    )
    # a body continuing the prompt
    body = build_program("    return sum(helper(x) for x in a)\n", prefix=prompt, entry_point="add")
    assert body.startswith(prompt)
    # a whole function in a fence, using the prompt's imports and helper
    whole = build_program(
        "```python\ndef add(a: List[int]) -> int:\n    return sum(map(helper, a))\n```",
        prefix=prompt,
        entry_point="add",
    )
    for program in (body, whole):
        assert run_code_tests(program, "assert add([1, 2, 3]) == 6\n").passed


def test_runs_in_the_calling_python() -> None:
    result = run_code_tests("import sys\nprint(sys.version_info[:2])\n", "")
    assert result.stdout.strip() == str(tuple(sys.version_info[:2]))
