"""The built-in prompt sources: train splits only, docstring prompts, a seeded interleaved mix."""

from __future__ import annotations

import json

from warpdecode.bench.prompts import held_out_stdlib_files
from warpdecode.data.corpus import split_of
from warpdecode.data.datasets import dataset_file
from warpdecode.datamodules import prompt_sources
from warpdecode.datamodules.prompt_sources import load_prompts


def test_builtin_sources_use_train_splits_only(monkeypatch):
    gsm8k = prompt_sources.gsm8k_train_prompts()
    with dataset_file("gsm8k/test.jsonl").open(encoding="utf-8") as f:
        test_questions = {json.loads(line)["question"] for line in f if line.strip()}
    assert len(gsm8k) == 7473 and not {p.messages[0][1] for p in gsm8k} & test_questions

    stdlib = prompt_sources.stdlib_docstring_prompts()
    files = {p.id.split(":")[0].removeprefix("stdlib/") for p in stdlib}
    assert len(stdlib) > 1000 and len(files) > 100
    assert all(split_of(key, 0.05, 0.05) == "train" for key in files)
    assert not files & {key for key, _ in held_out_stdlib_files()}
    assert all(p.messages[0][1].startswith("Write a Python ") for p in stdlib)

    monkeypatch.setitem(prompt_sources.SOURCES, "stdlib_docstrings", lambda: list(stdlib))  # parsed once: 5 s
    mixed = load_prompts(["gsm8k_train", "stdlib_docstrings"], max_prompts=6, seed=0)
    assert [p.id.split("/")[0] for p in mixed] == ["gsm8k_train", "stdlib"] * 3
    assert mixed == load_prompts(["gsm8k_train", "stdlib_docstrings"], max_prompts=6, seed=0)
    assert mixed != load_prompts(["gsm8k_train", "stdlib_docstrings"], max_prompts=6, seed=1)


def test_docstring_prompts_name_the_function_and_its_first_paragraph():
    source = '''
def area(width: float, height: float = 1.0) -> float:
    """Return the area of a rectangle
    of the given size.

    More detail that is left out.
    """

class Shape:
    def scale(self, factor):
        """Scale the shape by factor in every direction."""

def _private(x):
    """A private helper is never a prompt, however long its docstring."""

def short():
    """Too short."""
'''
    prompts = list(prompt_sources.docstring_prompts("geometry.py", source))
    assert [p.id for p in prompts] == ["stdlib/geometry.py:2:area", "stdlib/geometry.py:10:Shape.scale"]
    signature = "area(width: float, height: float=1.0)"
    text = f"Write a Python function `{signature}`: Return the area of a rectangle of the given size."
    assert prompts[0].messages == (("user", text),)
    assert prompts[1].messages[0][1] == ("Write a Python method `Shape.scale(self, factor)`: "
                                         "Scale the shape by factor in every direction.")
