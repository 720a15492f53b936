"""Checks and loading shared by the subcommands."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warpdecode.models.backbone import Backbone
    from warpdecode.models.tokenizer import Tokenizer




def _names(text: str | None) -> list[str]:
    """The non-empty, stripped items of a comma-separated option (none for None)."""
    return [item.strip() for item in (text or "").split(",") if item.strip()]


MAX_THREADS = 4096
"""More intra-op threads than this is a typo (torch overflows on larger counts)."""


def _check_threads(threads: int | None) -> None:
    """Refuse a `--threads` count below 1 (torch would raise at set_num_threads, or later in a worker)."""
    from warpdecode.errors import ConfigError

    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise ConfigError(f"--threads must be between 1 and {MAX_THREADS} (or left out for torch's choice), got {threads}")


def _check_output_directory(out: Path, flag: str) -> None:
    """Refuse an output directory that is an existing file (or lies under one), before any work is done."""
    from warpdecode.errors import ConfigError

    for path in (out, *out.parents):
        if path.exists() and not path.is_dir():
            raise ConfigError(f"{flag} {out}: {path} is a file, not a directory")


def _deprecated(flag: str, instead: str) -> str:
    """The one-line warning for an option form kept for old command lines."""
    return f"warning: {flag} is deprecated; write {instead}"


def _check_one(value: str, flag: str, what: str, plural: str) -> None:
    """Refuse a comma-separated list where a command runs one backend or method."""
    from warpdecode.errors import ConfigError

    if "," in value:
        raise ConfigError(f"{flag} names one {what}, got {value!r}; `warpdecode bench {plural}` compares several")


def _load_target(model: str | None, package: Path | None, backend: str, device: str, threads: int | None,
                 dtype: str = "fp32") -> tuple[Backbone, Tokenizer | None, dict[str, dict[str, Any]], str]:
    """The backbone to run, its tokenizer, the drafter options a package supplies, and the default method."""
    from warpdecode.decoding import registry
    from warpdecode.runtime.load import load_backbones, open_package

    loaded = open_package(package)
    backbones, tokenizer = load_backbones(model, loaded, [backend], device=device, dtype=dtype, threads=threads)
    if loaded is None:
        return backbones[backend], tokenizer, {}, "none"
    options = registry.package_options(loaded.drafter_directories())
    return backbones[backend], tokenizer, options, loaded.generation.get("method", "none")
