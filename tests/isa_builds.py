"""The C kernels built for another instruction set than this machine's: their bits must equal the
native build's (`kernels/csrc`: every SIMD path computes the portable loop's arithmetic)."""

from __future__ import annotations

import ctypes
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from warpdecode.kernels.native import CSRC, cpu_flags

MARCHES = {"x86-64": set(), "haswell": {"avx2", "fma", "f16c"}}
"""-march values and the CPU flags each needs to run: the portable loops (x86-64: 16-lane vector types lowered
to SSE) and the AVX2 paths (haswell)."""


def build_for(march: str, sources: list[str], tmp_path: Path) -> ctypes.CDLL:
    """`sources` (file names in csrc, pool.c added) compiled with -march=`march` and the kernels' own
    flags; skips the test when there is no compiler or this CPU cannot run that instruction set."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"-march={march} is an x86-64 target, this machine is {platform.machine()}")
    missing = MARCHES[march] - set(cpu_flags().split())
    if missing:
        pytest.skip(f"this CPU has no {', '.join(sorted(missing))}")
    so = tmp_path / f"{march}.so"
    subprocess.run(["cc", "-O3", f"-march={march}", "-ffp-contract=off", "-fPIC", "-shared", "-o", str(so),
                    *(str(CSRC / name) for name in [*sources, "pool.c"]), "-lm", "-lpthread"],
                   check=True, capture_output=True, timeout=120)
    return ctypes.CDLL(str(so))
