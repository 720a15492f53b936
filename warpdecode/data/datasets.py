"""Where the evaluation and training sets live: `$WARPDECODE_DATASETS`, by default
`<repo>/../shared/datasets` (Spec-Bench, HumanEval, GSM8K; their licenses are beside them)."""

from __future__ import annotations

import os
from pathlib import Path

from warpdecode.errors import ConfigError


def datasets_dir() -> Path:
    default = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"
    return Path(os.environ.get("WARPDECODE_DATASETS", default))


def dataset_file(relative: str) -> Path:
    path = datasets_dir() / relative
    if not path.is_file():
        raise ConfigError(f"dataset file {path} not found; set WARPDECODE_DATASETS to the folder that holds "
                          f"{relative} (default: <repo>/../shared/datasets)")
    return path
