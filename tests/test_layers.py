"""The import-linter contracts of pyproject.toml (run by `make test` through `lint-imports`) cover
every module of the package, and really reject an import that goes up a floor."""

from __future__ import annotations

import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import warpdecode

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _floors() -> list[list[str]]:
    layers = next(c for c in _contracts() if c["type"] == "layers")["layers"]
    return [[name.strip() for name in floor.split("|")] for floor in layers]


def test_every_module_of_the_package_is_on_a_floor():
    on_a_floor = {name for floor in _floors() for name in floor}
    modules = {f"warpdecode.{m.name}" for m in pkgutil.iter_modules(warpdecode.__path__)}
    assert modules - on_a_floor == set(), "add new packages to the layers contract in pyproject.toml"
    assert on_a_floor - modules == set()


def test_lightning_is_forbidden_on_every_floor_below_the_datamodules():
    floors = [name for floor in _floors() for name in floor]
    below = floors[floors.index("warpdecode.datamodules") + 1 :]
    forbidden = next(c for c in _contracts() if "lightning" in c.get("forbidden_modules", []))
    assert "lightning" in forbidden["forbidden_modules"]
    base = {"warpdecode.errors", "warpdecode.progress", "warpdecode.io"}
    assert set(forbidden["source_modules"]) == set(below) - base


@pytest.mark.skipif(shutil.which("lint-imports", path=str(Path(sys.executable).parent)) is None,
                    reason="import-linter is a dev dependency")
def test_an_import_up_a_floor_breaks_the_contract(tmp_path):
    """A copy of the package where a model file imports the decoding floor fails `lint-imports`."""
    shutil.copytree(ROOT / "warpdecode", tmp_path / "warpdecode", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    lint = [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    kept = subprocess.run(lint, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert kept.returncode == 0, kept.stdout[-2000:]
    with (tmp_path / "warpdecode" / "models" / "config.py").open("a") as f:
        f.write("\nfrom warpdecode.decoding import engine  # noqa: E402,F401\n")
    broken = subprocess.run(lint, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert broken.returncode == 1
    assert "warpdecode.models.config -> warpdecode.decoding.engine" in broken.stdout
