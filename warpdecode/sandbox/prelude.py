"""Runs in the sandboxed program's process before it: removes what the program must not use, then runs
`main.py` as `__main__` (standard library only; `python -I -B prelude.py GUARDS`).

GUARDS is a comma-separated list of what to take away, chosen by `warpdecode.sandbox` for how isolated
the process already is:

* `network`: every way the `socket` module opens a socket raises `PermissionError`;
* `ctypes`: `import ctypes` fails (it would reach the C functions that the other guards remove);
* `fork`: `os.fork` and the other process-creating functions are gone (where RLIMIT_NPROC does not apply);
* `signals`: `os.kill`, `os.killpg` and the like are gone (where the program could signal the evaluator).

Removing functions in the same process is a speed bump, not a wall: code that reaches the C library
another way gets past it. The namespaces and resource limits set by `launcher.py` are the walls.
"""

import sys


def _refuse(*args: object, **kwargs: object) -> None:
    raise PermissionError("the sandbox allows no network access")


def _guard(guards: set[str]) -> None:
    import os
    import posix

    if "network" in guards:
        import _socket
        import socket

        for module in (socket, _socket):
            for name in ("socket", "socketpair", "fromfd", "create_connection", "create_server", "getaddrinfo",
                         "gethostbyname", "gethostbyname_ex", "gethostbyaddr"):
                if hasattr(module, name):
                    setattr(module, name, _refuse)
        socket.SocketType = _socket.SocketType = _refuse  # type: ignore[misc,assignment]
    if "ctypes" in guards:
        sys.modules["ctypes"] = None  # type: ignore[assignment]
        sys.modules["_ctypes"] = None  # type: ignore[assignment]
    names = set()
    if "fork" in guards:
        names |= {"fork", "forkpty", "vfork", "system", "popen", "posix_spawn", "posix_spawnp", "execv", "execve",
                  "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe"}
        sys.modules["_posixsubprocess"] = None  # type: ignore[assignment]
    if "signals" in guards:
        names |= {"kill", "killpg", "pidfd_open"}
        import signal

        for name in ("pthread_kill", "pidfd_send_signal"):
            if hasattr(signal, name):
                delattr(signal, name)
    for module in (os, posix):
        for name in names:
            if hasattr(module, name):
                delattr(module, name)


_guard(set(filter(None, sys.argv[1].split(","))))
del _guard
sys.argv = ["main.py"]
import runpy

runpy.run_path("main.py", run_name="__main__")
