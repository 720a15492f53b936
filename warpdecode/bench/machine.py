"""What a benchmark records about the machine, and the per-generation peak-memory probe."""

from __future__ import annotations

import ctypes
import datetime
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from typing_extensions import Self

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    try:
        proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, check=False,
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() or None


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages: how busy the (shared) machine was."""
    return [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None


def machine_info(device: torch.device | None = None) -> dict[str, Any]:
    """The machine a benchmark ran on; with a CUDA `device`, its GPU's name and memory too."""
    try:
        import transformers

        transformers_version: str | None = transformers.__version__
    except ImportError:
        transformers_version = None
    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers_version,
        "torch_threads": torch.get_num_threads(),
        "load_average": load_average(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": _git_commit(),
    } | (_gpu_info(device) if device is not None and device.type == "cuda" else {})


def _gpu_info(device: torch.device) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(device)
    return {"device": str(device), "gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "cuda": torch.version.cuda}


def _status_kib(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.MULTILINE)
    if match is None:
        raise OSError(f"no {field} in {_STATUS}")
    return int(match.group(1))


def _release_free_heap() -> None:
    """Return free malloc memory to the OS (glibc `malloc_trim`), so that a block's allocations show
    as RSS growth whether or not an earlier block left freed pages resident. No-op elsewhere."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakRSS:
    """Peak resident memory of this process during a block, above the resident memory at its start.

    Linux keeps the high-water mark (`VmHWM`) of the resident set; writing 5 to
    `/proc/self/clear_refs` resets it to the current RSS, so every measured block starts from its own
    baseline. Free heap memory is first returned to the OS: without that, a block that reuses pages
    freed by the previous one shows almost no growth (measured: 3 MiB instead of 60 MiB for
    transformers after a warpdecode generation). `mib` is None where the high-water mark cannot be
    reset (not Linux, or the file is not writable).

        with PeakRSS() as peak:
            generate(...)
        peak.mib   # MiB above the RSS just before the block
    """

    def __init__(self) -> None:
        self.mib: float | None = None
        self._start_kib: int | None = None

    def __enter__(self) -> Self:
        _release_free_heap()
        try:
            _CLEAR_REFS.write_text("5")
            self._start_kib = _status_kib("VmRSS")
        except OSError:
            self._start_kib = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._start_kib is not None:
            try:
                self.mib = max(0, _status_kib("VmHWM") - self._start_kib) / 1024
            except OSError:
                self.mib = None
