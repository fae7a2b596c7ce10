"""Run code a model wrote inside a real isolation layer: bubblewrap (Debian package ``bubblewrap``,
installed by envs/setup.sh), the unprivileged sandbox Flatpak is built on.

What the program gets: a new PID, network, IPC, UTS and user namespace (it sees only its own
processes, has no network, not even loopback to the host's services); a read-only view of the
system's ``/usr``, ``/lib*``, ``/bin`` and nothing else of the host (no home, no project, no
caches, no credentials); an empty private writable ``/work`` and ``/tmp``; a cleared environment;
its own session (it cannot signal the scorer's process group). When its main process ends, the
namespace's init ends and the kernel kills every process it forked. Limits (setrlimit, inherited
by every process inside): CPU seconds, address space per process, process count (the sandbox
runs as ``nobody`` when the scorer is root, so the count is its own), file size; a wall-clock
timeout; stdout and stderr captured to a bounded tail. The memory of all its processes together
and their number are capped by a cgroup of their own (v2, or v1's memory and pids controllers)
where the scorer may create one (root, or a delegated subtree); elsewhere total memory is bounded
by ``memory_bytes * max_processes`` only, and ``cgroup_in_use()`` says which holds.

Where bubblewrap is missing, nothing runs unless the caller passes ``unsafe_no_sandbox=True``.
"""

from __future__ import annotations

import os
import resource
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

NOBODY = 65534
SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib32", "/lib64", "/sbin", "/etc/alternatives")


class SandboxUnavailable(RuntimeError):
    """No isolation tool on this machine, and no explicit unsafe opt-in."""


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 20.0  # wall clock
    cpu_s: int = 21  # per process
    memory_bytes: int = 2 << 30  # address space per process, and all processes together (cgroup)
    max_processes: int = 16
    file_bytes: int = 64 << 20  # largest file it may write
    output_bytes: int = 64 << 10  # stdout/stderr tail kept


@dataclass
class Result:
    returncode: int | None  # None: killed at the timeout
    output: bytes  # the last ``output_bytes`` of stdout + stderr
    output_total: int  # bytes the program wrote in all
    timed_out: bool


def interpreter() -> str:
    """The Python that runs inside: the system's (readable by ``nobody``, stdlib only)."""
    for candidate in ("/usr/bin/python3", shutil.which("python3") or ""):
        if candidate and os.access(candidate, os.X_OK) and not candidate.startswith(("/root", "/home")):
            return candidate
    raise SandboxUnavailable("no system python3 under /usr for the sandbox (install Debian's python3)")


def available() -> bool:
    return shutil.which("bwrap") is not None


def _bwrap_argv(program_dir: Path, python: str) -> list[str]:
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/work", "--setenv", "LANG", "C.UTF-8"]
    for d in SYSTEM_DIRS:
        if Path(d).exists():
            argv += ["--ro-bind", d, d]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/work",
             "--ro-bind", str(program_dir), "/sandbox", "--chdir", "/work", python, "-I", "/sandbox/program.py"]
    return argv


def _count_processes(uid: int) -> int:
    n = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                n += entry.stat().st_uid == uid
            except OSError:
                pass
    return n


class _Cgroup:
    """A cgroup for one sandbox run: memory and process count of every process inside, together."""

    V2, V1 = Path("/sys/fs/cgroup"), {"memory": Path("/sys/fs/cgroup/memory"), "pids": Path("/sys/fs/cgroup/pids")}

    def __init__(self, limits: Limits):
        self.dirs: list[Path] = []
        name = f"melt-sandbox-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            if (self.V2 / "cgroup.controllers").is_file() and {"memory", "pids"} <= set(
                    (self.V2 / "cgroup.controllers").read_text().split()):
                d = self.V2 / name
                d.mkdir()
                self.dirs = [d]
                (d / "memory.max").write_text(str(limits.memory_bytes))
                (d / "memory.swap.max").write_text("0") if (d / "memory.swap.max").exists() else None
                (d / "pids.max").write_text(str(limits.max_processes + 2))
            elif all(p.is_dir() for p in self.V1.values()):
                for root in self.V1.values():
                    (root / name).mkdir()
                    self.dirs.append(root / name)
                (self.V1["memory"] / name / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
                (self.V1["pids"] / name / "pids.max").write_text(str(limits.max_processes + 2))
        except OSError:  # not ours to create (no root, no delegation): rlimits only
            self.remove()

    def enter(self) -> None:
        """In the child before exec: join every controller's group (the namespace inherits it)."""
        for d in self.dirs:
            (d / "cgroup.procs").write_text(str(os.getpid()))

    def remove(self) -> None:
        for d in self.dirs:
            for _ in range(50):  # the processes are dying; the kernel frees the group shortly after
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.02)
        self.dirs = []


def cgroup_in_use(limits: Limits = Limits()) -> bool:
    group = _Cgroup(limits)
    try:
        return bool(group.dirs)
    finally:
        group.remove()


def _preexec(limits: Limits, group: _Cgroup):
    def apply() -> None:
        group.enter()
        if os.geteuid() == 0:  # root is exempt from RLIMIT_NPROC: run as nobody, whose count is ours
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
        nproc = limits.max_processes + _count_processes(os.getuid())
        for what, value in ((resource.RLIMIT_CPU, limits.cpu_s), (resource.RLIMIT_AS, limits.memory_bytes),
                            (resource.RLIMIT_NPROC, nproc), (resource.RLIMIT_FSIZE, limits.file_bytes),
                            (resource.RLIMIT_CORE, 0)):
            resource.setrlimit(what, (value, value))

    return apply


def _drain(stream, keep: int, sink: dict) -> None:
    """Read everything (so the program never blocks on a full pipe), keep the tail."""
    tail, total = b"", 0
    while chunk := stream.read(1 << 16):
        total += len(chunk)
        tail = (tail + chunk)[-keep:]
    sink["tail"], sink["total"] = tail, total


def run_untrusted(source: str, stdin: bytes = b"", limits: Limits = Limits(),
                  unsafe_no_sandbox: bool = False) -> Result:
    """Run Python ``source`` (given as a file, never argv: any length) isolated; returns its exit
    status and output tail. ``stdin`` is fed to it (e.g. a nonce the scorer checks for)."""
    if not available() and not unsafe_no_sandbox:
        raise SandboxUnavailable(
            "refusing to run model-written code: bubblewrap (bwrap) is not installed, so there is no "
            "isolation layer. Install it (`apt-get install bubblewrap`, done by envs/setup.sh as root), or "
            "set the task's `unsafe_no_sandbox: true` to run it unisolated at your own risk")
    with tempfile.TemporaryDirectory(prefix="melt-sandbox-") as tmp:
        program_dir = Path(tmp)
        (program_dir / "program.py").write_text(source)
        os.chmod(program_dir, 0o755)
        os.chmod(program_dir / "program.py", 0o644)
        if available():
            argv, cwd, env = _bwrap_argv(program_dir, interpreter()), None, None
        else:  # explicit unsafe opt-in: limits only, no isolation
            argv = [interpreter(), "-I", str(program_dir / "program.py")]
            cwd, env = tmp, {"PATH": "/usr/bin:/bin"}
        group = _Cgroup(limits)
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                cwd=cwd, env=env, preexec_fn=_preexec(limits, group), start_new_session=True)
        sink: dict = {}
        reader = threading.Thread(target=_drain, args=(proc.stdout, limits.output_bytes, sink), daemon=True)
        reader.start()
        try:
            proc.stdin.write(stdin)
            proc.stdin.close()
        except BrokenPipeError:
            pass
        timed_out = False
        try:
            proc.wait(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, 9)  # bwrap's session: its namespace dies with it
            proc.wait()
        if not available():  # unisolated: end whatever it forked into its session
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
        # the program's main process has ended; its namespace (and any child holding the pipe) is
        # gone with it, so the reader reaches end of file promptly
        reader.join(timeout=5)
        group.remove()
        return Result(None if timed_out else proc.returncode, sink.get("tail", b""), sink.get("total", 0), timed_out)
