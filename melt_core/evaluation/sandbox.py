"""Run code a model wrote inside a real isolation layer: bubblewrap (Debian package ``bubblewrap``,
installed by envs/setup.sh), the unprivileged sandbox Flatpak is built on.

What the program gets: a new PID, network, IPC, UTS and user namespace (it sees only its own
processes, has no network, not even loopback to the host's services); a read-only view of the
system's ``/usr``, ``/lib*``, ``/bin`` and nothing else of the host (no home, no project, no
caches, no credentials); a read-only root; a cleared environment; its own session (it cannot
signal the scorer's process group). bwrap itself is started by absolute path from the system's
directories (never found through ``PATH``) with an environment of three fixed variables, so
nothing of the scorer's environment exists anywhere inside, ``/proc/1/environ`` (bwrap, PID 1 of
the namespace) included. When its main process ends, the namespace's init ends and the kernel
kills every process it forked. Limits (setrlimit, inherited by every process inside): CPU
seconds, address space per process, process count (the sandbox runs as ``nobody`` when the
scorer is root, so the count is its own), file size; a wall-clock timeout; output captured to a
bounded tail. The memory of all its processes together and their number are capped by a cgroup
of their own (v2, or v1's memory and pids controllers) where the scorer may create one (root, or
a delegated subtree); elsewhere total memory is bounded by ``memory_bytes * max_processes`` only,
and ``cgroup_in_use()`` says which holds. Writable space: ``/tmp`` and ``/work`` as tmpfs of
``tmp_bytes`` each where bwrap can size them (``--size``, bubblewrap >= 0.10); else tmpfs whose
pages count against the cgroup's memory where there is one; else none at all (read-only).

bwrap's own failure (user namespaces blocked, a missing mount point) is never mistaken for the
program's: bwrap reports the child it started on a status descriptor, and a run whose child never
started raises ``SandboxError`` with bwrap's message. ``self_test()`` runs a known-good and a
known-bad program, so a task that needs the sandbox fails when it is built, naming the cause.

Where bubblewrap is missing, nothing runs unless the caller passes ``unsafe_no_sandbox=True``.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import select
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

NOBODY = 65534
SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib32", "/lib64", "/sbin", "/etc/alternatives")
BWRAP_PATHS = ("/usr/bin/bwrap", "/bin/bwrap", "/usr/local/bin/bwrap")
# bwrap's own environment, which the program could read as /proc/1/environ: nothing of the scorer's
BWRAP_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/work"}


class SandboxUnavailable(RuntimeError):
    """No isolation tool on this machine, and no explicit unsafe opt-in."""


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program in it): never a score."""


class _NamespaceBusy(SandboxError):
    """bwrap's clone() got EAGAIN: a namespace or process count is momentarily at its limit (the
    kernel still reaping the last sandbox's processes, say). Starting again shortly succeeds."""


START_WAITS_S = (0.5, 1.0, 2.0, 4.0)  # the pauses before each new start after EAGAIN


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 20.0  # wall clock
    cpu_s: int = 21  # per process
    memory_bytes: int = 2 << 30  # address space per process, and all processes together (cgroup)
    max_processes: int = 16
    file_bytes: int = 64 << 20  # largest file it may write
    tmp_bytes: int = 64 << 20  # size of each writable tmpfs (/tmp, /work)
    output_bytes: int = 64 << 10  # stdout/stderr tail kept
    reply_bytes: int = 256 << 20  # largest reply line a session accepts


@dataclass
class Result:
    returncode: int | None  # None: killed at the timeout
    output: bytes  # the last ``output_bytes`` of stdout + stderr
    output_total: int  # bytes the program wrote in all
    timed_out: bool


def bwrap_path() -> str | None:
    return next((p for p in BWRAP_PATHS if os.access(p, os.X_OK)), None)


def available() -> bool:
    return bwrap_path() is not None


def interpreter() -> str:
    """The Python that runs inside: the system's (readable by ``nobody``; envs/setup.sh installs
    numpy for it, which HumanEval+ solutions may import)."""
    for candidate in ("/usr/bin/python3", "/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    raise SandboxUnavailable("no system python3 under /usr/bin for the sandbox (install Debian's python3)")


@cache
def _bwrap_sizes_tmpfs(bwrap: str) -> bool:
    try:
        out = subprocess.run([bwrap, "--help"], capture_output=True, text=True, env=BWRAP_ENV, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return "--size" in out.stdout + out.stderr


def _bwrap_argv(bwrap: str, program_dir: Path, command: list[str], limits: Limits, cgroup: bool,
                status_fd: int) -> list[str]:
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
            "--json-status-fd", str(status_fd),
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/work", "--setenv", "LANG", "C.UTF-8"]
    for d in SYSTEM_DIRS:
        if Path(d).exists():
            argv += ["--ro-bind", d, d]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for d in ("/tmp", "/work"):
        if _bwrap_sizes_tmpfs(bwrap):
            argv += ["--size", str(limits.tmp_bytes), "--tmpfs", d]
        elif cgroup:  # tmpfs pages are charged to the writer's cgroup: bounded by memory_bytes
            argv += ["--tmpfs", d]
        else:  # nothing could bound a tmpfs: no writable place at all
            argv += ["--dir", d]
    argv += ["--ro-bind", str(program_dir), "/sandbox", "--remount-ro", "/", "--chdir", "/work", *command]
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


class Sandboxed:
    """One program running isolated: ``files`` written into a read-only ``/sandbox``, then
    ``python3 -I /sandbox/<args[0]> <args[1:]>``. With ``merge_output`` stdout joins stderr in the
    captured tail; otherwise stdout is a channel read with ``receive``. Use as a context manager:
    leaving it kills everything inside and removes its files and cgroup."""

    def __init__(self, files: dict[str, str], args: list[str], limits: Limits = Limits(),
                 unsafe_no_sandbox: bool = False, merge_output: bool = False):
        bwrap = bwrap_path()
        if bwrap is None and not unsafe_no_sandbox:
            raise SandboxUnavailable(
                "refusing to run model-written code: bubblewrap (bwrap) is not installed in "
                f"{' or '.join(BWRAP_PATHS)}, so there is no isolation layer. Install it (`apt-get install "
                "bubblewrap`, done by envs/setup.sh as root), or set the task's `unsafe_no_sandbox: true` to run "
                "it unisolated at your own risk")
        self.limits, self.isolated = limits, bwrap is not None
        for wait in (*START_WAITS_S, None):
            try:
                return self._start(files, args, bwrap, merge_output)
            except _NamespaceBusy:
                if wait is None:
                    raise
                time.sleep(wait)

    def _start(self, files: dict[str, str], args: list[str], bwrap: str | None, merge_output: bool) -> None:
        limits = self.limits
        self.deadline = time.monotonic() + limits.timeout_s
        self._tmp = tempfile.TemporaryDirectory(prefix="melt-sandbox-")
        program_dir = Path(self._tmp.name)
        for name, text in files.items():
            (program_dir / name).write_text(text)
            os.chmod(program_dir / name, 0o644)
        os.chmod(program_dir, 0o755)
        self._group = _Cgroup(limits)
        python = interpreter()
        status_r, status_w = os.pipe()
        if self.isolated:
            command = [python, "-I", f"/sandbox/{args[0]}", *args[1:]]
            argv = _bwrap_argv(bwrap, program_dir, command, limits, bool(self._group.dirs), status_w)
            cwd = None
        else:  # explicit unsafe opt-in: limits only, no isolation
            argv, cwd = [python, "-I", str(program_dir / args[0]), *args[1:]], self._tmp.name
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_output else subprocess.PIPE, cwd=cwd, env=dict(BWRAP_ENV),
            preexec_fn=_preexec(limits, self._group), start_new_session=True, pass_fds=(status_w,))
        os.close(status_w)
        self._sink: dict = {}
        self._tail = self.proc.stdout if merge_output else self.proc.stderr
        self._reader = threading.Thread(target=_drain, args=(self._tail, limits.output_bytes, self._sink), daemon=True)
        self._reader.start()
        self._buffer = b""
        self._status_r = status_r  # open until the end: bwrap writes the exit status there too
        try:
            if self.isolated:
                self._await_child(status_r)
        except BaseException:
            self.close()
            raise

    def _await_child(self, status_r: int) -> None:
        """bwrap writes ``{"child-pid": N}`` once the program is started; EOF before it means
        bwrap itself failed (its message is in the output tail)."""
        data = b""
        while b"child-pid" not in data:
            ready, _, _ = select.select([status_r], [], [], max(0.0, self.deadline - time.monotonic()))
            chunk = os.read(status_r, 4096) if ready else b""
            if not chunk:
                self.proc.wait(timeout=5) if ready else None
                self._reader.join(timeout=2)
                message = self._sink.get("tail", b"").decode(errors="replace").strip()
                error = _NamespaceBusy if "Resource temporarily unavailable" in message else SandboxError
                raise error(f"bubblewrap could not start the sandbox (exit {self.proc.returncode}): "
                            f"{message or 'no message'}. Typical causes: unprivileged user namespaces "
                            "are disabled (sysctl kernel.unprivileged_userns_clone=1, or "
                            "user.max_user_namespaces > 0), or an AppArmor/seccomp policy forbids them")
            data += chunk

    def allow(self, seconds: float) -> None:
        """Give the program ``seconds`` from now for what comes next (a per-call time limit)."""
        self.deadline = time.monotonic() + seconds

    def send(self, message: dict) -> bool:
        """Write one JSON line to the program; False when it is gone, stalled or out of time."""
        return self.write(json.dumps(message).encode() + b"\n")

    def write(self, data: bytes) -> bool:
        """Write ``data`` to the program's stdin; False when it is gone, stalled or out of time."""
        fd = self.proc.stdin.fileno()
        os.set_blocking(fd, False)
        while data:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0 or not select.select([], [fd], [], remaining)[1]:
                return False
            try:
                data = data[os.write(fd, data):]
            except (BrokenPipeError, BlockingIOError):
                return False
        return True

    def receive(self) -> dict | None:
        """The next JSON line from the program's channel; None at its end, past the deadline, on a
        line over ``reply_bytes`` or on anything that is not a JSON object."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0 or len(self._buffer) > self.limits.reply_bytes:
                return None
            if not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth: the program's loss
            return None
        return message if isinstance(message, dict) else None

    def wait(self) -> Result:
        """Feed nothing more, wait for the program's end (or the deadline), and collect its output."""
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        timed_out = False
        try:
            self.proc.wait(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
        self.close()
        return Result(None if timed_out else self.proc.returncode, self._sink.get("tail", b""),
                      self._sink.get("total", 0), timed_out)

    def close(self) -> None:
        """Kill everything inside (bwrap's session; its namespace dies with it) and clean up."""
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._reader.join(timeout=5)  # the namespace is gone: its pipes reach their end
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                stream.close() if stream is not None else None
            except OSError:
                pass
        if self._status_r is not None:
            os.close(self._status_r)
            self._status_r = None
        self._group.remove()
        self._tmp.cleanup()

    def __enter__(self) -> Sandboxed:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_untrusted(source: str, stdin: bytes = b"", limits: Limits = Limits(),
                  unsafe_no_sandbox: bool = False) -> Result:
    """Run Python ``source`` (given as a file, never argv: any length) isolated; returns its exit
    status and output tail. ``stdin`` is fed to it."""
    box = Sandboxed({"program.py": source}, ["program.py"], limits, unsafe_no_sandbox, merge_output=True)
    box.write(stdin)  # a program that stops reading or ends early: the rest is not its to read
    return box.wait()


def self_test(limits: Limits = Limits(timeout_s=30.0)) -> None:
    """A known-good program must run and a known-bad one must fail, or the sandbox is not usable
    here: raises SandboxError naming what went wrong."""
    good = run_untrusted("print(6 * 7)", limits=limits)
    if good.returncode != 0 or good.output.strip() != b"42":
        raise SandboxError(f"sandbox self-test: a program printing 42 gave exit {good.returncode} and output "
                           f"{good.output[-300:]!r}")
    bad = run_untrusted("raise SystemExit(3)", limits=limits)
    if bad.returncode != 3:
        raise SandboxError(f"sandbox self-test: a program exiting 3 gave exit {bad.returncode}")
