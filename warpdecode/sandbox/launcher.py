"""The sandbox's first process: isolate, fork the program's process, relay its exit (standard library only).

Run as `python -I -B launcher.py CONFIG_JSON` by `warpdecode.sandbox.run_program`, in a new session, in
the program's temporary working directory, before any of the program runs. CONFIG_JSON holds
`namespaces` (bool), `filters` (the seccomp groups), `guards` (the prelude's guard names), the limits (`cpu_seconds`, `memory_bytes`,
`file_bytes`, `processes`), `workdir` and `python`. With `namespaces` the launcher enters new user, mount,
network and PID namespaces; its child, PID 1 there, sees the file system read-only
except for `workdir`, has no network interface but a downed loopback, and cannot signal any process
outside its namespace but its process group (this launcher, whose death ends it). The child gives up every capability, sets the resource limits, installs a
seccomp filter that refuses the system calls of `filters` with EPERM, and execs the interpreter on the
prelude (`prelude.py`), which runs `main.py`. The launcher waits and ends the way its child ended (exit
status, or the same signal). A setup step that fails ends the launcher with status 125 and a `sandbox:`
line on stderr, before the program starts.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
from pathlib import Path

SETUP_FAILED = 125
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY, SYS_MOUNT_SETATTR = -100, 0x8000, 1, 442  # x86-64 and arm64 number
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 24, 38, 22, 2
# seccomp: audit architecture, and the system calls refused with EPERM, by group (`filters` in CONFIG_JSON)
SYSCALLS = {
    "x86_64": (0xC000003E, {"processes": [56, 57, 58, 435], "network": [41, 53, 425],
                            "signals": [62, 200, 234, 129, 297, 424, 101]}),
    "aarch64": (0xC00000B7, {"processes": [220, 435], "network": [198, 199, 425],
                             "signals": [129, 130, 131, 138, 240, 424, 117]}),
}
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x06
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, SECCOMP_RET_KILL_PROCESS, EPERM = 0x7FFF0000, 0x00050000, 0x80000000, 1

libc = ctypes.CDLL(None, use_errno=True)


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def check(result: int, what: str) -> None:
    if result != 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")


def enter_namespaces() -> None:
    """New user, mount, network and PID namespaces (the next fork is PID 1), the user mapped to itself.

    A user namespace even for root: the kernel never applies RLIMIT_NPROC to root of the initial user
    namespace (whatever its capabilities), but does to root of a new one.
    """
    uid, gid = os.geteuid(), os.getegid()
    check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID), "unshare")
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")


def read_only_except(workdir: str) -> None:
    """Every mount read-only, recursively, except a writable bind mount of `workdir` (mount namespace only)."""
    check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")
    check(libc.mount(workdir.encode(), workdir.encode(), None, MS_BIND, None), "bind the working directory")
    for path, attr in ((b"/", MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)), (workdir.encode(), MountAttr(0, MOUNT_ATTR_RDONLY, 0, 0))):
        check(libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path, AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)),
              "mount attributes")


def drop_capabilities() -> None:
    """Empty the capability bounding set (so the exec'd interpreter has none, root or not) and forbid gaining any."""
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # past the last capability this kernel knows


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]


def seccomp_program(arch: int, refused: list[int]) -> list[tuple[int, int, int, int]]:
    """A classic-BPF seccomp filter: another architecture is killed, x32 calls (bit 30 set) and
    `refused` get EPERM, anything else is allowed. Jumps count the instructions they skip."""
    deny = 5 + len(refused) + 1  # index of the EPERM return: 5 header instructions, the checks, ALLOW
    program = [(BPF_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
               (BPF_JEQ_K, 1, 0, arch),
               (BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
               (BPF_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
               (BPF_JGE_K, deny - 5, 0, 0x40000000)]
    for number in refused:
        program.append((BPF_JEQ_K, deny - (len(program) + 1), 0, number))
    return [*program, (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW), (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM)]


def install_seccomp(groups: list[str]) -> None:
    """Refuse the system calls of `groups` (processes, network, signals) to this process and what it execs."""
    if os.uname().machine not in SYSCALLS:
        raise OSError(f"seccomp: no system call table for {os.uname().machine}")
    arch, numbers = SYSCALLS[os.uname().machine]
    program = seccomp_program(arch, [n for group in groups for n in numbers[group]])
    filters = (SockFilter * len(program))(*(SockFilter(*instruction) for instruction in program))
    fprog = SockFprog(len(program), filters)
    check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def set_limits(config: dict) -> None:
    limits = [(resource.RLIMIT_CPU, (config["cpu_seconds"], config["cpu_seconds"] + 1)),
              (resource.RLIMIT_AS, (config["memory_bytes"],) * 2),
              (resource.RLIMIT_FSIZE, (config["file_bytes"],) * 2),
              (resource.RLIMIT_CORE, (0, 0))]
    for which, value in limits:
        resource.setrlimit(which, value)


def child(config: dict) -> None:
    """The program's process: limits, then exec the prelude (never returns)."""
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "parent-death signal")
    if config["namespaces"]:
        read_only_except(config["workdir"])
        os.chdir(config["workdir"])  # onto the writable bind mount (the old cwd is the read-only one beneath)
        drop_capabilities()
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    set_limits(config)
    # processes (threads included) of this user: counted per user, so with 0 the program forks nothing
    resource.setrlimit(resource.RLIMIT_NPROC, (config["processes"],) * 2)
    if config["filters"]:
        install_seccomp(config["filters"])
    prelude = str(Path(__file__).with_name("prelude.py"))
    env = {"PATH": "/usr/bin:/bin", "HOME": config["workdir"], "TMPDIR": config["workdir"], "LANG": "C.UTF-8"}
    os.execve(config["python"], [config["python"], "-I", "-B", prelude, ",".join(config["guards"])], env)


def main() -> None:
    config = json.loads(sys.argv[1])
    try:
        if config["namespaces"]:
            enter_namespaces()
        pid = os.fork()
        if pid == 0:
            try:
                child(config)
            except OSError as e:
                print(f"sandbox: {e}", file=sys.stderr, flush=True)
            os._exit(SETUP_FAILED)
    except OSError as e:
        print(f"sandbox: {e}", file=sys.stderr, flush=True)
        sys.exit(SETUP_FAILED)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # their handlers cannot be set (and are the default)
            signal.signal(sig, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.kill(os.getpid(), sig)
    sys.exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
