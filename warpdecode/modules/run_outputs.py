"""Where a `fit` writes what it trained: beside the run's `checkpoints/` folder, or where the user said."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import Trainer


def output_dir(trainer: Trainer, export_dir: str | None, name: str) -> Path:
    """`export_dir` when given, else `<run dir>/<name>` (the run dir holds `checkpoints/`)."""
    if export_dir:
        return Path(export_dir)
    dirpath = getattr(trainer.checkpoint_callback, "dirpath", None)
    root = Path(dirpath).parent if dirpath else Path(trainer.default_root_dir)
    return root / name


def last_logged(trainer: Trainer, keys: tuple[str, ...]) -> dict[str, float]:
    """The last logged value of each of `keys` that was logged ("val/loss" → "loss"), rounded, for
    the `training` record a package keeps."""
    found = {key: trainer.callback_metrics.get(key) for key in keys}
    return {key.split("/")[-1]: round(float(value), 4) for key, value in found.items() if value is not None}
