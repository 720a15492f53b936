"""Runs CLI cases in one process and records how each ended (used by tests/test_cli_fuzz.py).

    python tests/cli_fuzz_worker.py CASES.json RESULTS.json

CASES.json is a list of {"id": str, "argv": [str, ...]}. Each case calls `warpdecode.cli.main(argv)` as the
console script does, with file descriptors 1 and 2 redirected to files (so what C libraries print is caught
too), under an alarm of `--timeout` seconds, and records the exit status (an exception escaping `main` is
status 1 with its traceback on stderr, as the interpreter would give), stderr, seconds and the process's
peak resident memory after the case. The address space for data is capped (`RLIMIT_DATA`), so an
allocation bomb fails here instead of exhausting the machine. RESULTS.json is rewritten after every case:
a crash of the worker itself still leaves what ran before it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path


class CaseTimeout(BaseException):
    """Raised by the alarm; a BaseException so that `except Exception` in the code under test cannot eat it."""


def _alarm(signum: int, frame: object) -> None:
    raise CaseTimeout


def run_case(argv: list[str], timeout: int) -> dict[str, object]:
    from warpdecode.cli import main

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.argv = ["warpdecode", *argv]  # as the console script sees it
        start = time.perf_counter()
        signal.alarm(timeout)
        try:
            try:
                main(list(argv))
                status: int | str = 0
            except SystemExit as e:
                status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except CaseTimeout:
                status = "timeout"
            except BaseException:  # noqa: BLE001 (what the interpreter would print before exiting with status 1)
                traceback.print_exc()
                status = 1
        except CaseTimeout:  # the alarm landed while an exception was being handled
            status = "timeout"
        finally:
            signal.alarm(0)
            seconds = time.perf_counter() - start
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
        err.seek(0)
        out.seek(0)
        stderr = err.read().decode("utf-8", "replace")
        stdout = out.read(4096).decode("utf-8", "replace")
    return {"status": status, "stderr": stderr[-4000:], "stdout": stdout, "seconds": round(seconds, 3),
            "peak_mib": round(peak_resident_mib())}


def peak_resident_mib() -> float:
    """This process's peak resident memory. `VmHWM` belongs to the process image (a fresh one at exec);
    `ru_maxrss` would also count the parent's peak before the fork and exec that started this worker."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", type=Path)
    parser.add_argument("results", type=Path)
    parser.add_argument("--timeout", type=int, default=30)
    parser.add_argument("--data-limit-gib", type=float, default=6.0)
    args = parser.parse_args()
    limit = int(args.data_limit_gib * (1 << 30))
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    signal.signal(signal.SIGALRM, _alarm)
    os.environ.setdefault("WANDB_MODE", "offline")
    import torch

    torch.set_num_threads(1)
    results: dict[str, dict[str, object]] = {}
    for case in json.loads(args.cases.read_text()):
        os.chdir(case.get("cwd", os.getcwd()))
        results[case["id"]] = run_case(case["argv"], args.timeout)
        args.results.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
