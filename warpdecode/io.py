"""Writing files and directories so that a reader never sees half of one, and hashing them: one copy each.

`atomic_file` and `atomic_directory` fill a temporary sibling and rename it into place (a rename within one
directory is atomic on POSIX file systems); an error removes the temporary sibling and leaves what was there.
`sha256_file` hashes a file in chunks; `content_key` names a cache entry after the JSON value it depends on;
`cache_dir` is where every cache lives.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

HASH_CHUNK = 1 << 22


def cache_dir() -> Path:
    """Where converted and assembled models, compiled kernels and data caches are kept: `$WARPDECODE_CACHE`,
    default `~/.cache/warpdecode`."""
    return Path(os.environ.get("WARPDECODE_CACHE", Path.home() / ".cache" / "warpdecode"))


def atomic_file(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """`write(file)` into a temporary sibling of `path`, then rename it over `path`: readers see the old
    file or the whole new one (a concurrent writer of the same content may win; either is complete)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(name, path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_directory(directory: Path, *, replace: bool = True) -> Iterator[Path]:
    """A temporary sibling folder to write into; when the block ends without error it becomes `directory`,
    so a half-written directory never appears (an error removes the temporary folder).

    Args:
        replace: an existing `directory` is replaced (an output the user named). False: a cache entry
            that a concurrent writer may have completed first: theirs is kept and ours dropped.
    """
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=directory.name + ".", dir=directory.parent))
    try:
        yield tmp
        if replace and directory.exists():
            shutil.rmtree(directory)
        try:
            tmp.rename(directory)
        except OSError:
            if replace or not directory.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file's bytes, read in 4 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def content_key(value: Any, length: int = 24) -> str:
    """A cache key for a JSON-serialisable `value`: the first `length` hex digits of the sha256 of its JSON
    with sorted keys (equal values give equal keys on any machine and in any process)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:length]
