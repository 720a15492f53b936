"""Small on-disk corpora for the datamodule tests."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

import pytest


def stdlib_sample(count: int) -> list[Path]:
    """`count` small top-level stdlib modules (3-8 kB each), in sorted order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in sorted(root.glob("*.py")) if 3000 <= p.stat().st_size <= 8000]
    assert len(files) >= count, "the interpreter's stdlib is unexpectedly small"
    return files[:count]


@pytest.fixture
def code_folder(tmp_path: Path) -> Path:
    """A folder of 30 Python files, a third of them one directory down."""
    folder = tmp_path / "corpus"
    for i, path in enumerate(stdlib_sample(30)):
        target = folder / ("pkg" if i % 3 == 0 else "") / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return folder
