"""The project's C kernels (`csrc/*.c`, one library): compiled on first use with the system C compiler
into `$WARPDECODE_CACHE/kernels/` and loaded through ctypes.

One build per set of sources, compiler flags, compiler and CPU (`-march=native`: the library is built
for the machine that runs it); an atomic rename publishes it to concurrent processes. The kernels share
one work pool (`csrc/pool.h`), so one library holds them all. Without a C compiler,
on another OS, or with `WARPDECODE_NATIVE=0`, a library is a one-line reason instead, and every
kernel falls back to its pure-PyTorch reference.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from warpdecode.io import cache_dir

CSRC = Path(__file__).with_name("csrc")
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared")
"""`-ffp-contract=off`: a multiply and an add stay two roundings unless the source asks for a fused
multiply-add (`fmaf`, intrinsics). Left to the compiler, contraction differs between two copies of the
same loop (a tail loop, a loop versioned by how its addresses are computed), and the kernels promise
the same bits for the same inputs whichever way they are reached."""
_build_lock = threading.Lock()


def cpu_flags() -> str:
    """The CPU's feature flags (the compiled kernel is built for them, `-march=native`)."""
    with contextlib.suppress(OSError):
        return next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")),
                    platform.processor())
    return platform.processor()


@functools.cache
def compiled() -> ctypes.CDLL | str:
    """The kernels' library, or why there is none (a one-line reason)."""
    if os.environ.get("WARPDECODE_NATIVE", "1") == "0":
        return "WARPDECODE_NATIVE=0"
    if platform.system() != "Linux":
        return f"the native kernels build on Linux only, not {platform.system()}"
    sources = sorted(CSRC.glob("*.c"))
    compiler = os.environ.get("CC", "cc")
    text = [p.read_bytes() for p in sorted([*sources, *CSRC.glob("*.h")])]
    key = hashlib.sha256(b"\0".join([*text, " ".join(FLAGS).encode(), compiler.encode(),
                                     cpu_flags().encode(), platform.machine().encode()])).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"warpdecode-kernels-{key}.so"
    with _build_lock:
        if not target.exists():
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                    built = Path(tmp) / target.name
                    subprocess.run([compiler, *FLAGS, "-o", str(built), *map(str, sources), "-lm", "-lpthread"],
                                   check=True, capture_output=True, timeout=120)
                    os.replace(built, target)
            except (OSError, subprocess.SubprocessError) as e:
                detail = getattr(e, "stderr", b"") or b""
                return f"compiling the C kernels with {compiler} failed: {e} {detail.decode(errors='replace')[:200]}".strip()
    try:
        return ctypes.CDLL(str(target))
    except OSError as e:
        return f"loading {target} failed: {e}"


def bound(name: str, argtypes: list[Any], restype: Any) -> ctypes.CDLL | str:
    """The library with the C function `name`'s signature declared, or why there is no library (one line)."""
    lib = compiled()
    if isinstance(lib, str):
        return lib
    function = getattr(lib, name)
    function.argtypes, function.restype = argtypes, restype
    return lib
