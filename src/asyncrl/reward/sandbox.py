"""The inside of the code sandbox: the script a sandboxed Python process runs.

``asyncrl.reward.code.run_code_tests`` starts ``python -I -B sandbox.py`` in a new session with a
scrubbed environment and writes one job (a ``marshal``-ed dict: same interpreter, and no json/re
import on the start-up path) to its stdin. This script (standard library only: it
must not import asyncrl) then isolates itself and runs the untrusted program followed by the tests:

1. **Namespaces** (best effort, reported on the status pipe). As root: new mount, network, PID,
   IPC and UTS namespaces. Otherwise the same inside a new user namespace (unprivileged user
   namespaces). Inside them every mount is remounted read-only, fresh size-limited tmpfs mounts
   cover ``/tmp``, ``/var/tmp`` and ``/dev/shm``, and the working directory is ``/tmp/work`` on that
   tmpfs (gone when the run ends). The network namespace has only a loopback interface.
2. **Processes.** The first child is PID 1 of the new PID namespace (a tiny init that reaps and
   forwards the exit status); when it exits the kernel kills everything left in the namespace.
   Signals from inside the namespace cannot reach the init or anything outside.
3. **Privileges.** As root the program runs under a fresh, unused uid/gid (so ``RLIMIT_NPROC``
   applies, root-owned files are read-only to it and it can signal nothing else); directories the
   interpreter needs under unreadable ancestors (e.g. ``/root/.pyenv``) are bind-mounted into a
   tmpfs that hides the rest. In a user namespace all capabilities are dropped. Always
   ``PR_SET_NO_NEW_PRIVS`` and a parent-death signal.
4. **Limits** (``setrlimit`` on the program process): CPU seconds, address space, processes,
   file size, open files, no core dumps.
5. **Verdict channel.** The harness reports phases on a separate pipe (``status_fd``): ``ready``
   before the program runs, ``tests`` once it returned, and ``done <nonce>`` only after the tests
   returned. A program that exits early (``sys.exit(0)``, ``os._exit(0)``) never produces ``done``.

Without namespaces (e.g. a container without user namespaces) only steps 3 (uid change as root,
when the interpreter stays readable), 4 and 5 apply; the parent then also kills the run by
process group and by an environment marker. See ``docs/reward.md``.
"""

from __future__ import annotations

import builtins
import ctypes
import marshal
import os
import resource
import signal
import stat
import struct
import sys
import types

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38

_PRESERVED_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}

WORKDIR_IN_NS = "/tmp/work"

_libc = ctypes.CDLL(None, use_errno=True)  # the interpreter links libc; find_library would fork ldconfig


class _SetupError(Exception):
    """Isolation could not be set up as required (reported, never the program's fault)."""


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None
    ret = _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    _check(ret, f"mount {target}")


def _prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), "prctl")


def _drop_capabilities() -> None:
    """Clear effective, permitted and inheritable capability sets (capset v3)."""
    header = struct.pack("Ii", 0x20080522, 0)
    data = bytes(24)
    hdr_buf = ctypes.create_string_buffer(header, len(header))
    data_buf = ctypes.create_string_buffer(data, len(data))
    _check(_libc.capset(hdr_buf, data_buf), "capset")
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:") and int(line.split()[1], 16) != 0:
                raise _SetupError("capabilities still effective after capset")


class _Status:
    """Line protocol to the parent over a dedicated pipe (small writes are atomic)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, line: str) -> None:
        try:
            os.write(self.fd, (line.replace("\n", " ") + "\n").encode())
        except OSError:
            pass


def _mountinfo() -> list[tuple[str, set[str]]]:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            mount_point = fields[4].encode().decode("unicode_escape")
            out.append((mount_point, set(fields[5].split(","))))
    return out


def _remount_all_readonly() -> list[str]:
    """Bind-remount every mount read-only (this mount namespace only); return the rw leftovers."""
    left = []
    for mount_point, opts in _mountinfo():
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for name, bit in _PRESERVED_FLAGS.items():
            if name in opts:
                flags |= bit
        try:
            _mount(None, mount_point, None, flags)
        except OSError:
            if "rw" in opts and not mount_point.startswith(("/proc", "/sys")):
                left.append(mount_point)
    return left


def _other_can_enter(path: str) -> bool:
    st = os.stat(path)
    return bool(st.st_mode & stat.S_IXOTH) and bool(st.st_mode & stat.S_IROTH)


def _blocked_ancestor(path: str) -> str | None:
    """The topmost proper ancestor of ``path`` that a stranger uid cannot traverse, if any."""
    parts = path.strip("/").split("/")
    cur = ""
    for part in parts[:-1]:
        cur = f"{cur}/{part}"
        if not os.stat(cur).st_mode & stat.S_IXOTH:
            return cur
    return None


def _expose_paths(paths: list[str]) -> list[str]:
    """Make ``paths`` reachable for an unprivileged uid by covering each blocked ancestor with a
    tmpfs and bind-mounting the needed paths back (read-only). Returns paths left unreachable."""
    unreachable = []
    groups: dict[str, list[str]] = {}
    for p in sorted(set(paths)):
        if not os.path.isdir(p):
            continue
        blocked = _blocked_ancestor(p)
        if blocked is None and _other_can_enter(p):
            continue
        if blocked is None or not _other_can_enter(p):
            unreachable.append(p)
            continue
        groups.setdefault(blocked, []).append(p)
    for blocked, needed in groups.items():
        minimal = [p for p in needed if not any(p != q and p.startswith(q + "/") for q in needed)]
        fds = [(p, os.open(p, os.O_PATH | os.O_DIRECTORY)) for p in minimal]
        _mount("tmpfs", blocked, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        for p, fd in fds:
            os.makedirs(p, mode=0o755, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC)
            _mount(None, p, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
            os.close(fd)
        _mount(None, blocked, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    return unreachable


def _interpreter_paths() -> list[str]:
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    paths += [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    return [os.path.realpath(p) for p in paths]


def _loopback_up() -> None:
    import fcntl
    import socket

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sh14x", b"lo", 0)
        flags = struct.unpack("16sh14x", fcntl.ioctl(s.fileno(), siocgifflags, ifreq))[1]
        fcntl.ioctl(s.fileno(), siocsifflags, struct.pack("16sh14x", b"lo", flags | iff_up))


def _setup_namespaces(job: dict, run_uid: int | None) -> dict:
    """Enter new namespaces and build the filesystem view. Returns what was enforced."""
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    uid, gid = os.getuid(), os.getgid()
    if uid != 0:
        flags |= CLONE_NEWUSER
    _unshare(flags)
    if uid != 0:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    info: dict = {"mode": "ns-root" if uid == 0 else "ns-user", "net": 1}
    unreachable = _expose_paths(_interpreter_paths()) if run_uid is not None else []
    rw_left = _remount_all_readonly()
    size = int(job["tmpfs_mb"])
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={size}m,mode=1777")
    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={size}m,mode=1777")
    if os.path.isdir("/var/tmp"):
        _mount("tmpfs", "/var/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=1777")
    os.mkdir(WORKDIR_IN_NS, 0o700)
    if run_uid is not None:
        os.chown(WORKDIR_IN_NS, run_uid, run_uid)
    try:
        _loopback_up()
    except OSError:
        pass
    info["fs_ro"] = 0 if rw_left else 1
    if rw_left:
        info["rw_left"] = ",".join(rw_left)
    if unreachable:
        info["unreachable"] = ",".join(unreachable)
    info["workdir"] = WORKDIR_IN_NS
    return info


def _drop_to_uid(run_uid: int) -> None:
    os.setgroups([])
    os.setresgid(run_uid, run_uid, run_uid)
    os.setresuid(run_uid, run_uid, run_uid)


def _set_limits(job: dict) -> None:
    cpu = int(job["cpu_s"])
    mem = int(job["memory_mb"]) * 1024 * 1024
    nproc = int(job["nproc"])
    if not job.get("isolated") and job.get("run_uid_dropped") is False and job.get("nproc_shared_uid"):
        nproc = int(job["nproc_shared_uid"])  # RLIMIT_NPROC counts every task of the caller's uid
    limits = [
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (mem, mem)),
        (resource.RLIMIT_NPROC, (nproc, nproc)),
        (resource.RLIMIT_FSIZE, (int(job["fsize_mb"]) * 1024 * 1024,) * 2),
        (resource.RLIMIT_NOFILE, (int(job["nofile"]), int(job["nofile"]))),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    for which, value in limits:
        resource.setrlimit(which, value)


def _run_untrusted(program: str, tests: str, nonce: str, status: _Status) -> None:
    """Run program then tests in one namespace; never returns."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    g = main.__dict__
    sys.argv = ["program.py"]
    sys.path.insert(0, os.getcwd())
    for phase, source in (("program", program), ("tests", tests)):
        status.send("ready" if phase == "program" else "tests")
        try:
            exec(compile(source, f"<{phase}>", "exec"), g)
        except SystemExit as e:
            code = e.code
            if phase == "tests" and code in (0, None):
                break
            status.send(f"exit {phase} {code if isinstance(code, int) else 1}")
            _flush()
            os._exit(code if isinstance(code, int) and code != 0 else 1)
        except MemoryError:
            status.send(f"memory {phase}")
            _flush()
            os._exit(1)
        except BaseException as e:  # noqa: BLE001 - report any failure of untrusted code
            try:
                import traceback

                traceback.print_exc()
            except BaseException:  # noqa: BLE001
                pass
            status.send(f"exc {phase} {type(e).__name__}")
            _flush()
            os._exit(1)
    _flush()
    status.send(f"done {nonce}")
    os._exit(0)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass


def _exit_code(wait_status: int) -> int:
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def _program_child(job: dict, status: _Status, workdir: str, run_uid: int | None, in_userns: bool) -> None:
    try:
        if run_uid is not None and os.getuid() == 0:
            _drop_to_uid(run_uid)
        if in_userns:
            _drop_capabilities()
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if workdir == WORKDIR_IN_NS:
            os.chdir(workdir)
        else:
            # by descriptor: after a partly failed namespace setup the host path may be hidden
            os.fchdir(int(job["host_workdir_fd"]))
        for key in ("HOME", "TMPDIR"):
            os.environ[key] = workdir
        _set_limits(job)
    except BaseException as e:  # noqa: BLE001
        status.send(f"setup_error program: {type(e).__name__}: {e}")
        os._exit(70)
    _run_untrusted(job.pop("program"), job.pop("tests"), job.pop("nonce"), status)


def _init_process(job: dict, status: _Status, workdir: str, run_uid: int | None, in_userns: bool) -> None:
    """PID 1 of the sandbox's PID namespace: mount its /proc, drop privileges (before the
    program exists, so the program never sees a privileged init), start the program, reap,
    forward its exit status."""
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        try:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        except OSError:
            pass  # e.g. a masked /proc in a container: the outer /proc stays (information only)
        if run_uid is not None and os.getuid() == 0:
            _drop_to_uid(run_uid)
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a uid change clears it
        if in_userns:
            _drop_capabilities()
    except BaseException as e:  # noqa: BLE001
        status.send(f"setup_error init: {type(e).__name__}: {e}")
        os._exit(70)
    pid = os.fork()
    if pid == 0:
        _program_child(job, status, workdir, run_uid, in_userns)
    for key in ("program", "tests", "nonce"):
        job.pop(key, None)
    while True:
        try:
            got, wait_status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(70)
        except InterruptedError:
            continue
        if got == pid:
            os._exit(_exit_code(wait_status))


def main() -> None:
    job = marshal.loads(sys.stdin.buffer.read())  # same interpreter as the parent; no json/re import
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    status = _Status(int(job["status_fd"]))
    expected_parent = int(job["parent_pid"])
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != expected_parent:
        os._exit(70)
    run_uid = job.get("run_uid") if os.getuid() == 0 else None
    job["host_workdir_fd"] = os.open(job["host_workdir"], os.O_RDONLY | os.O_DIRECTORY)
    info: dict = {}
    isolated = False
    if job.get("isolate", True):
        try:
            info = _setup_namespaces(job, run_uid)
            isolated = True
        except (OSError, _SetupError) as e:
            info = {"ns_error": f"{type(e).__name__}: {e}".replace(" ", "_")}
            if job.get("require_isolation"):
                status.send(f"setup_error namespaces unavailable: {e}")
                os._exit(70)
    if not isolated:
        info["mode"] = "rlimit-root" if os.getuid() == 0 else "rlimit-user"
        info["net"] = 0
        info["fs_ro"] = 0
        workdir = job["host_workdir"]
        if run_uid is not None:
            unreachable = [p for p in _interpreter_paths() if _blocked_ancestor(p) or not _other_can_enter(p)]
            if unreachable:
                info["unreachable"] = ",".join(unreachable)
                run_uid = None  # keep root rather than break the interpreter; reported
            else:
                os.fchown(job["host_workdir_fd"], run_uid, run_uid)
    else:
        workdir = WORKDIR_IN_NS
    info["uid"] = run_uid if run_uid is not None else os.getuid()
    job["isolated"] = isolated
    job["run_uid_dropped"] = run_uid is not None
    status.send("iso " + " ".join(f"{k}={v}" for k, v in info.items()))
    sys.stdout.flush()
    sys.stderr.flush()
    gate_r, gate_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(gate_w)
        os.read(gate_r, 1)  # wait until the parent has reported our pid (before any untrusted code)
        os.close(gate_r)
        if isolated:
            _init_process(job, status, workdir, run_uid, in_userns=os.getuid() != 0)
        else:
            _program_child(job, status, workdir, run_uid, in_userns=False)
        os._exit(70)
    os.close(gate_r)
    for key in ("program", "tests", "nonce"):
        job.pop(key, None)
    status.send(f"{'init' if isolated else 'child'} {pid}")
    os.write(gate_w, b"x")
    os.close(gate_w)
    while True:
        try:
            _, wait_status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(70)
    os._exit(_exit_code(wait_status))


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # noqa: BLE001 - any harness failure is an infrastructure error
        if isinstance(exc, SystemExit):
            raise
        sys.stderr.write(f"asyncrl sandbox harness failed: {exc!r}\n")
        os._exit(70)
