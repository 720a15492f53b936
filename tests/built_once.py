"""Expensive test fixtures built once per test run, also under pytest-xdist (`make test` runs two workers).

A session or module fixture runs in every worker that runs a test needing it. `built_once` makes the
first worker build the artifact into the run's shared temporary folder under a file lock; the others
wait for it and reuse it. Without xdist it simply builds into a fresh temporary folder.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """`root / name` after `build(root)` ran once in this test run (root: a folder for this artifact alone;
    `build` writes `root / name`). A build that failed is retried by the next worker that asks."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        root = tmp_path_factory.mktemp(name)
        build(root)
        return root / name
    shared = tmp_path_factory.getbasetemp().parent  # the run's base folder, shared by its workers
    root, done = shared / f"built-{name}", shared / f"built-{name}.done"
    with FileLock(str(shared / f"built-{name}.lock")):
        if not done.exists():
            root.mkdir(exist_ok=True)
            build(root)
            done.touch()
    return root / name
