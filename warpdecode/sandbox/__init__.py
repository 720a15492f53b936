"""Run an untrusted Python program (generated code) in a sandbox and say how it ended.

`run_program(source, limits)` writes `source` as `main.py` into a fresh temporary directory, runs it
in a subprocess of the current interpreter (`python -I -B`, in its own session) and removes the
directory afterwards. The program gets:

* a wall-clock limit (the whole process group is killed with SIGKILL) and a CPU-time limit (RLIMIT_CPU);
* an address-space limit (RLIMIT_AS: allocations past it raise `MemoryError`), a file-size limit
  (RLIMIT_FSIZE: a write past it fails with EFBIG, as Python ignores SIGXFSZ), no core files,
  stdout / stderr capped;
* where the kernel lets it create user namespaces (`Isolation.namespaces`): new user, mount, network
  and PID namespaces, so the file system is read-only except its directory, there is no network, and
  no process outside can be signalled; and no capabilities;
* where seccomp filters work (`Isolation.seccomp`, x86-64 and arm64): fork / clone and socket calls
  fail with EPERM (and signals, without namespaces); RLIMIT_NPROC 0 besides (never applied to root);
* always, a prelude that takes `socket` and `ctypes` away, and where the layers above are missing,
  process creation and signals too (`prelude.py`: a speed bump, not a wall).

`isolation()` probes once per process which layers this machine gives; docs/eval.md says what each
guarantees and what it does not. The result is a `SandboxResult`: passed (exit status 0), failed
(another exit status), timeout (the wall-clock limit) or killed (a signal: CPU time, file size...).
"""

from __future__ import annotations

import functools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from warpdecode.errors import CapabilityError, ConfigError

LAUNCHER = Path(__file__).with_name("launcher.py")
SETUP_FAILED = 125  # launcher.py's status when a setup step fails
Status = Literal["passed", "failed", "timeout", "killed"]
SIGNAL_REASONS = {signal.SIGXCPU: "CPU time limit", signal.SIGXFSZ: "file size limit",
                  signal.SIGKILL: "SIGKILL (CPU time hard limit, or out of memory)"}


@dataclass(frozen=True)
class Limits:
    """What one program may use."""

    wall_seconds: float = 3.0
    """Wall-clock time from the start of the sandbox's first process; then the process group is killed."""
    cpu_seconds: int | None = None
    """CPU time (RLIMIT_CPU, soft; SIGKILL one second later); default: the wall-clock limit rounded up."""
    memory_bytes: int = 1 << 30
    """Address space (RLIMIT_AS) of the program's process; the interpreter itself maps ~30 MB."""
    file_bytes: int = 16 << 20
    """Largest file the program may write (RLIMIT_FSIZE)."""
    output_bytes: int = 64 << 10
    """Kept of stdout and of stderr each; the rest is read and dropped."""

    def __post_init__(self) -> None:
        for name in ("wall_seconds", "memory_bytes", "file_bytes", "output_bytes"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"sandbox {name} must be > 0, got {getattr(self, name)}")
        if self.cpu_seconds is not None and self.cpu_seconds < 1:
            raise ConfigError(f"sandbox cpu_seconds must be >= 1, got {self.cpu_seconds}")

    @property
    def cpu(self) -> int:
        return self.cpu_seconds if self.cpu_seconds is not None else max(1, int(-(-self.wall_seconds // 1)))


@dataclass(frozen=True)
class SandboxResult:
    status: Status
    reason: str
    """Why it ended: `exit status 0`, the last line of stderr, `wall-clock limit 3.0 s`, `CPU time limit`..."""
    returncode: int | None
    """The first process's exit status (negative: the signal that ended it); None after a timeout."""
    stdout: str
    stderr: str
    seconds: float

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclass(frozen=True)
class Isolation:
    """The layers this machine gives a sandboxed program (`isolation()` probes them)."""

    namespaces: bool
    """New user, mount, network and PID namespaces: read-only files but its directory, no network, no
    signals out, no capabilities."""
    seccomp: bool
    """A seccomp filter refuses process creation (fork, clone), sockets and, without namespaces, signals."""
    processes_limited: bool
    """The program cannot start a process (seccomp, or RLIMIT_NPROC, which never applies to root)."""

    @property
    def filters(self) -> tuple[str, ...]:
        """The seccomp groups of system calls refused (launcher.py's SYSCALLS)."""
        if not self.seccomp:
            return ()
        return ("processes", "network") + (() if self.namespaces else ("signals",))

    @property
    def guards(self) -> tuple[str, ...]:
        """What the prelude takes away: always sockets and ctypes; what the layers above do not stop."""
        return ("network", "ctypes") + (() if self.processes_limited else ("fork",)) + (
            () if self.namespaces or self.seccomp else ("signals",))

    def describe(self) -> str:
        layers = ["namespaces (read-only files but its own, no network, no signals out)" if self.namespaces
                  else "no namespaces (files outside its directory stay writable)"]
        layers.append("seccomp (no processes, sockets" + ("" if self.namespaces else ", signals") + ")"
                      if self.seccomp else "no seccomp")
        layers.append("rlimits" + ("" if self.processes_limited else "; processes and signals only removed by the prelude"))
        return ", ".join(layers)


FORK_PROBE = """import os, sys
try:
    pid = os.fork()
except OSError:
    sys.exit(0)
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
sys.exit(3)
"""


@functools.cache
def isolation() -> Isolation:
    """Probe (once per process) the strongest layers this machine gives, and whether forks are refused."""
    for namespaces, seccomp in ((True, True), (False, True), (False, False)):
        guess = Isolation(namespaces, seccomp, processes_limited=True)
        try:
            result = run_program(FORK_PROBE, Limits(wall_seconds=10), layers=guess)
        except CapabilityError:
            continue
        return Isolation(namespaces, seccomp, processes_limited=result.passed)
    raise CapabilityError("the sandbox cannot start a program here (its launcher fails even without namespaces)")


def run_program(source: str, limits: Limits = Limits(), *, layers: Isolation | None = None) -> SandboxResult:
    """Run `source` as `main.py` in a sandbox under `limits` with `layers` (default: the probed `isolation()`).

    Raises `CapabilityError` when the sandbox itself cannot be set up (never for what the program does).
    """
    if layers is None:
        layers = isolation()
    workdir = Path(tempfile.mkdtemp(prefix="warpdecode-sandbox-"))
    config = {"namespaces": layers.namespaces, "filters": list(layers.filters), "guards": list(layers.guards), "cpu_seconds": limits.cpu,
              "memory_bytes": limits.memory_bytes, "file_bytes": limits.file_bytes, "processes": 0,
              "workdir": str(workdir), "python": sys.executable}
    try:
        (workdir / "main.py").write_text(source, encoding="utf-8")
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-I", "-B", str(LAUNCHER), json.dumps(config)], cwd=workdir,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
        try:
            stdout, stderr, finished = _collect(proc, started + limits.wall_seconds, limits.output_bytes)
        finally:
            _kill_group(proc.pid)  # what is left of the session, in every case
            proc.wait()
        seconds = time.monotonic() - started
    finally:
        _remove(workdir)
    out, err = stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace")
    if not finished:
        return SandboxResult("timeout", f"wall-clock limit {limits.wall_seconds:g} s", None, out, err, seconds)
    code = proc.returncode
    if code == SETUP_FAILED and err.startswith("sandbox: "):
        raise CapabilityError(f"the sandbox could not be set up: {err.splitlines()[0].removeprefix('sandbox: ')}")
    if code < 0:
        sig = signal.Signals(-code)
        return SandboxResult("killed", SIGNAL_REASONS.get(sig, sig.name), code, out, err, seconds)
    if code == 0:
        return SandboxResult("passed", "exit status 0", code, out, err, seconds)
    last = next((line.strip() for line in reversed(err.splitlines()) if line.strip()), "")
    return SandboxResult("failed", last[:300] or f"exit status {code}", code, out, err, seconds)


def run_programs(sources: Sequence[str], limits: Limits = Limits(), *, workers: int = 1) -> list[SandboxResult]:
    """`run_program` on each source, `workers` at a time, results in the order of `sources`."""
    layers = isolation()
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda source: run_program(source, limits, layers=layers), sources))


def _collect(proc: subprocess.Popen[bytes], deadline: float, cap: int) -> tuple[bytes, bytes, bool]:
    """Read stdout and stderr (the first `cap` bytes of each kept) until the process ends or `deadline`
    passes; returns them and whether the process ended in time."""
    assert proc.stdout is not None and proc.stderr is not None
    kept = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    with selectors.DefaultSelector() as selector:
        for fd in kept:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return bytes(kept[proc.stdout.fileno()]), bytes(kept[proc.stderr.fileno()]), False
            for key, _ in selector.select(remaining):
                data = os.read(key.fd, 1 << 16)
                if not data:
                    selector.unregister(key.fd)
                buffer = kept[key.fd]
                buffer += data[: max(0, cap - len(buffer))]
    try:
        proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return bytes(kept[proc.stdout.fileno()]), bytes(kept[proc.stderr.fileno()]), False
    return bytes(kept[proc.stdout.fileno()]), bytes(kept[proc.stderr.fileno()]), True


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _remove(workdir: Path) -> None:
    """Remove the working directory, even where the program took its own permissions away."""
    for path in (workdir, *workdir.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o700)
    shutil.rmtree(workdir, ignore_errors=True)
