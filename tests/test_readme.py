"""The README says what the code does: its methods table is the registry's, its Python quick start runs."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import runpy
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def methods_table_script() -> ModuleType:
    """scripts/methods_table.py, imported from its path (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("methods_table", ROOT / "scripts" / "methods_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return methods_table_script()


def test_readme_methods_table_is_the_registrys(script):
    rows = script.methods_json()
    readme = README.read_text(encoding="utf-8")
    assert script.current_table(readme) == script.table(rows), "run: python scripts/methods_table.py"
    # every registered component has its row: 2 header lines + one per component
    assert len(script.current_table(readme).splitlines()) == 2 + len(rows)


def test_check_mode_fails_on_a_stale_table_and_writing_fixes_it(script, tmp_path, capsys):
    readme = tmp_path / "README.md"
    stale = f"# title\n\n{script.BEGIN}\n| name |\n|---|\n| `gone` |\n{script.END}\n\nafter\n"
    readme.write_text(stale, encoding="utf-8")
    assert script.main(["--check", "--readme", str(readme)]) == 1
    assert readme.read_text(encoding="utf-8") == stale
    assert script.main(["--readme", str(readme)]) == 0
    written = readme.read_text(encoding="utf-8")
    assert written.startswith(f"# title\n\n{script.BEGIN}\n| name | kind |") and written.endswith(f"{script.END}\n\nafter\n")
    assert "| `prompt_lookup` | drafter | yes | no |" in written
    assert script.main(["--check", "--readme", str(readme)]) == 0
    assert "stale" in capsys.readouterr().err


def test_table_renders_flags_and_escapes_pipes(script):
    rows: list[dict[str, Any]] = [
        {"kind": "verifier", "name": "typical", "lossless": False, "needs_training": False,
         "options": {"epsilon": {}, "delta": {}}, "summary": "a | b."},
        {"kind": "controller", "name": "fixed", "lossless": None, "needs_training": False, "options": {},
         "summary": "Fixed."},
        {"kind": "commit_policy", "name": "learn2pd", "lossless": False, "needs_training": True,
         "options": {"path": {}}, "summary": "Learn2PD."},
    ]
    assert script.table(rows).splitlines()[2:] == [
        "| `typical` | verifier | **no** | no | a \\| b. | `epsilon`, `delta` |",
        "| `fixed` | controller | – | no | Fixed. | – |",
        "| `learn2pd` | diffusion commit policy | **no** | yes | Learn2PD. | `path` |",
    ]


def test_missing_markers_are_refused(script):
    with pytest.raises(ValueError, match="methods table"):
        script.current_table("# a README without the markers\n")


def quick_start_code() -> str:
    """The first python block after the README's "Quick start in Python" heading, as written."""
    readme = README.read_text(encoding="utf-8")
    section = readme[readme.index("## Quick start in Python"):]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None
    return found.group(1)


def test_quick_start_uses_only_top_level_names():
    imports = [line for line in quick_start_code().splitlines() if line.startswith(("import ", "from "))]
    assert imports == ["import torch", "from warpdecode import generate, load"]
    assert len(quick_start_code().splitlines()) <= 12


def test_importing_warpdecode_loads_no_torch():
    """`import warpdecode` runs before every command: the re-exports must be lazy."""
    import subprocess

    code = "import sys, warpdecode; print(sorted(m for m in ('torch', 'warpdecode.decoding') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_quick_start_runs_as_written(tmp_path):
    """The README's quick start, run as written on the default model; what its comments promise holds."""
    from warpdecode import generate

    path = tmp_path / "quick_start.py"
    path.write_text(quick_start_code(), encoding="utf-8")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        namespace = runpy.run_path(str(path))
    model, tokenizer, prompt, out, story = (namespace[k] for k in ("model", "tokenizer", "prompt", "out", "story"))
    assert printed.getvalue().startswith(out.text)
    # "lossless: greedy's tokens", and the prompt's words were drafted (more than one token per forward)
    assert out.token_ids == generate(model, tokenizer, prompt, max_new_tokens=64).token_ids
    assert out.stats.tau > 1.5
    assert 0 < len(story.token_ids) <= 64 and story.stats.target_forwards < len(story.token_ids)


def test_methods_named_in_the_readme_are_registered():
    from warpdecode.decoding import registry

    readme = README.read_text(encoding="utf-8")
    named = set(re.findall(r'--method (\w+)|method="(\w+)"|build_method\("(\w+)"', readme))
    names = {name for group in named for name in group if name}
    assert {"prompt_lookup", "int4_self", "draft_model"} <= names
    assert names <= {name for kind in ("drafter", "commit_policy", "search", "rule") for name in registry.names(kind)}
    assert set(re.findall(r"--verifier (\w+)", readme)) <= set(registry.names("verifier"))
    assert set(re.findall(r"--controller (\w+)", readme)) <= set(registry.names("controller"))
