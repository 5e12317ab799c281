"""Hostile programs for the sandbox tests (each must end as a failed verdict, quickly, leaving
nothing behind). ``{outside}`` is a path outside the run's directory the program tries to write,
``{port}`` a TCP port the test listens on (on the host's loopback)."""

from __future__ import annotations

import os

HOSTILE: dict[str, str] = {
    "fork_bomb": """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
""",
    "infinite_loop": """
while True:
    pass
""",
    "allocate_20gb": """
chunks = []
chunks.append(bytearray(20 * 1024 ** 3))
""",
    "fill_disk": """
import os
i = 0
while True:
    with open(f"fill{i}", "wb") as f:
        for _ in range(64):
            f.write(b"x" * (1 << 20))
    i += 1
""",
    "network": """
import socket
s = socket.create_connection(("127.0.0.1", {port}), timeout=2)
s.sendall(b"escaped")
s2 = socket.create_connection(("1.1.1.1", 80), timeout=2)
""",
    "kill_parent": """
import os, signal, time
os.kill(os.getppid(), signal.SIGKILL)
try:
    os.kill(-1, signal.SIGKILL)
except OSError:
    pass
time.sleep(0.5)
""",
    "output_flood": """
import sys
while True:
    sys.stdout.write("x" * 65536)
    sys.stderr.write("y" * 65536)
""",
    "exit_before_tests": """
import sys
sys.exit(0)
""",
    "os_exit_before_tests": """
import os
os._exit(0)
""",
    "write_outside": """
import os
for path in ("{outside}", os.path.expanduser("~/../escaped"), "/tmp/../var/tmp/asyncrl-escaped-{port}"):
    try:
        with open(path, "w") as f:
            f.write("escaped")
    except OSError:
        pass
with open("inside.txt", "w") as f:
    f.write("fine")
""",
    "setsid_daemon": """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(60)
    os._exit(0)
time.sleep(0.2)
""",
}

# The tests call solution(); no hostile program defines it after its attack.
TESTS = "assert solution() == 42\n"


def sandbox_processes(callers: set[int] | None = None, run_id: str | None = None) -> list[int]:
    """Pids of live sandbox processes: of one run (``run_id``), or of runs started by the given
    caller pids (this process and its children by default). Other sandboxes that happen to run on
    the machine at the same time are not counted."""
    if callers is None:
        callers = {os.getpid(), *_children(os.getpid())}
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state == b"Z":
            continue
        for var in env:
            if not var.startswith(b"ASYNCRL_SANDBOX_RUN="):
                continue
            value = var.split(b"=", 1)[1].decode()
            if (run_id is not None and value == run_id) or (
                run_id is None and value.split("-")[0].isdigit() and int(value.split("-")[0]) in callers
            ):
                found.append(int(name))
    return found


def _children(pid: int) -> set[int]:
    kids = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[1]) == pid:
                        kids.add(int(name))
            except (OSError, ValueError, IndexError):
                continue
    return kids
