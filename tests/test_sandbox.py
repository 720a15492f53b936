"""The sandbox runs good programs and contains hostile ones: each is counted as not passed, and the
test process, its files and its signals are untouched. Every hostile program runs under each
isolation level this machine gives (the probed one and the weaker fallbacks)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from warpdecode.errors import ConfigError
from warpdecode.sandbox import FORK_PROBE, Isolation, Limits, isolation, run_program, run_programs

FAST = Limits(wall_seconds=2.0, cpu_seconds=1, memory_bytes=256 << 20, file_bytes=1 << 20, output_bytes=1000)


def _levels() -> list[Isolation]:
    """The probed isolation, and each weaker one that starts here (processes_limited probed for each)."""
    best = isolation()
    levels = [best]
    for namespaces, seccomp in ((False, True), (False, False)):
        if (namespaces, seccomp) == (best.namespaces, best.seccomp) or (seccomp and not best.seccomp):
            continue
        probe = run_program(FORK_PROBE, layers=Isolation(namespaces, seccomp, processes_limited=True))
        levels.append(Isolation(namespaces, seccomp, processes_limited=probe.passed))
    return levels


LEVELS = _levels()
LEVEL_IDS = [f"ns={i.namespaces}-seccomp={i.seccomp}" for i in LEVELS]


@pytest.fixture(params=LEVELS, ids=LEVEL_IDS)
def level(request) -> Isolation:
    return request.param


def test_a_correct_program_passes_and_its_output_comes_back(level):
    result = run_program("import math\nassert math.factorial(5) == 120\nprint('ok')", FAST, layers=level)
    assert (result.status, result.stdout, result.returncode) == ("passed", "ok\n", 0)


def test_a_wrong_program_fails_with_its_error_as_the_reason(level):
    result = run_program("def add(a, b):\n    return a - b\nassert add(2, 2) == 4, 'add is wrong'", FAST, layers=level)
    assert (result.status, result.reason) == ("failed", "AssertionError: add is wrong")


@pytest.mark.parametrize("program, statuses", [
    ("while True:\n    pass", {"timeout", "killed"}),  # CPU limit (SIGXCPU) or the wall clock, whichever first
    ("import time\ntime.sleep(60)", {"timeout"}),
    ("import os, time\nos.setsid()\ntime.sleep(60)", {"timeout"}),  # its own session: still killed
])
def test_a_program_that_does_not_end_is_stopped(program, statuses):
    result = run_program(program, Limits(wall_seconds=1.0, cpu_seconds=1))
    assert result.status in statuses and not result.passed


def test_a_program_ended_by_a_signal_is_reported_as_killed():
    aborted = run_program("import os\nos.abort()", FAST)
    assert aborted.status == "killed" and aborted.returncode is not None and aborted.returncode < 0
    # SIGXCPU ignored: the CPU hard limit (one second later) sends SIGKILL, relayed by the launcher
    program = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass"
    hard = run_program(program, Limits(wall_seconds=60, cpu_seconds=1))
    assert (hard.status, hard.returncode) == ("killed", -signal.SIGKILL)


def test_a_fork_bomb_is_refused(level):
    result = run_program("import os\nwhile True:\n    os.fork()", FAST, layers=level)
    assert result.status == "failed" and ("PermissionError" in result.reason or "BlockingIOError" in result.reason
                                          or "AttributeError" in result.reason)


def test_threads_and_subprocesses_are_refused(level):
    program = "import threading\nthreading.Thread(target=print).start()"
    assert run_program(program, FAST, layers=level).status == ("failed" if level.processes_limited else "passed")
    program = "import subprocess\nsubprocess.run(['true'])"
    assert run_program(program, FAST, layers=level).status == "failed"


@pytest.mark.parametrize("program", ["x = bytearray(1 << 30)",
                                     "chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 20))"])
def test_a_memory_hog_gets_a_memory_error(level, program):
    result = run_program(program, FAST, layers=level)
    assert result.status == "failed" and result.reason == "MemoryError"


def test_a_file_filler_stops_at_the_file_size_limit(level):
    program = "with open('big', 'wb') as f:\n    while True:\n        f.write(b'x' * 65536)"
    result = run_program(program, FAST, layers=level)
    assert result.status == "failed" and "File too large" in result.reason


def test_a_program_may_write_files_in_its_own_directory_which_is_removed_afterwards(level):
    program = "import os\nopen('notes.txt', 'w').write('hi')\nprint(os.getcwd())\nprint(open('notes.txt').read())"
    result = run_program(program, FAST, layers=level)
    workdir, text = result.stdout.splitlines()
    assert result.passed and text == "hi" and not Path(workdir).exists()


@pytest.mark.parametrize("program", [
    "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)",
    "import _socket\n_socket.socket().connect(('127.0.0.1', {port}))",
])
def test_a_socket_connection_is_refused(level, program):
    import socket

    with socket.socket() as server:  # a listener the program would reach without the sandbox
        server.bind(("127.0.0.1", 0))
        server.listen()
        result = run_program(program.format(port=server.getsockname()[1]), FAST, layers=level)
    assert result.status == "failed" and "PermissionError" in result.reason


def test_a_program_cannot_signal_the_evaluator_or_kill_its_parent(level):
    received = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: received.append(1))
    try:
        to_us = run_program(f"import os, signal\nos.kill({os.getpid()}, signal.SIGUSR1)", FAST, layers=level)
        to_parent = run_program("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", FAST, layers=level)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert received == [] and not to_us.passed and not to_parent.passed


def test_a_program_cannot_write_outside_its_directory(tmp_path):
    level = isolation()
    if not level.namespaces:
        pytest.skip("without namespaces the file system stays writable (docs/eval.md)")
    target = tmp_path / "outside.txt"
    result = run_program(f"open({str(target)!r}, 'w').write('escaped')", FAST, layers=level)
    assert result.status == "failed" and "Read-only file system" in result.reason and not target.exists()
    result = run_program("open('../escaped.txt', 'w').write('escaped')", FAST, layers=level)
    assert result.status == "failed" and "Read-only file system" in result.reason


def test_output_is_capped():
    result = run_program("import sys\nsys.stdout.write('x' * 1_000_000)\nsys.stderr.write('y' * 1_000_000)", FAST)
    assert result.passed and (len(result.stdout), len(result.stderr)) == (1000, 1000)


def test_run_programs_keeps_the_order_of_the_sources():
    results = run_programs([f"print({i})" for i in range(4)], FAST, workers=2)
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)]


def test_limits_are_checked():
    with pytest.raises(ConfigError, match="wall_seconds"):
        Limits(wall_seconds=0)
    with pytest.raises(ConfigError, match="cpu_seconds"):
        Limits(cpu_seconds=0)
