"""Named prompt sets read from the shared evaluation sets (the real files)."""

import gzip
import json
import sysconfig
from collections import Counter
from pathlib import Path

import pytest

from warpdecode.bench.prompts import (
    EDIT_INSTRUCTION,
    STDLIB_MIN_LINES,
    STDLIB_PROMPT_LINES,
    load_prompts,
    with_typos,
)
from warpdecode.data.corpus import Corpus, split_of
from warpdecode.data.datasets import datasets_dir
from warpdecode.errors import ConfigError

MT_BENCH = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]
SPEC_BENCH_OTHERS = ["translation", "summarization", "qa", "math_reasoning", "rag"]


def test_spec_bench_categories_counts_and_first_turns():
    prompts = load_prompts("spec_bench")
    counts = Counter(p.category for p in prompts)
    assert list(counts) == MT_BENCH + SPEC_BENCH_OTHERS  # file order
    assert counts == {**dict.fromkeys(MT_BENCH, 10), **dict.fromkeys(SPEC_BENCH_OTHERS, 80)}
    rows = [json.loads(line) for line in (datasets_dir() / "spec_bench/question.jsonl").open()]
    assert [p.text for p in prompts] == [r["turns"][0] for r in rows]
    assert prompts[0].id == "spec_bench/81" and prompts[0].chat is None  # chat template when the model has one


def test_limit_is_per_category():
    prompts = load_prompts("spec_bench", limit=2)
    assert len(prompts) == 26
    assert Counter(p.category for p in prompts) == dict.fromkeys(MT_BENCH + SPEC_BENCH_OTHERS, 2)
    assert [p.id for p in prompts[:3]] == ["spec_bench/81", "spec_bench/82", "spec_bench/91"]


def test_categories_select_and_unknown_ones_are_named():
    prompts = load_prompts("spec_bench", categories="summarization, rag", limit=3)
    assert [p.category for p in prompts] == ["summarization"] * 3 + ["rag"] * 3
    with pytest.raises(ConfigError, match="unknown category rags.*summarization"):
        load_prompts("spec_bench", categories="rags")


def test_humaneval_is_raw_completion():
    prompts = load_prompts("humaneval")
    assert len(prompts) == 164 and {p.category for p in prompts} == {"humaneval"}
    assert not any(p.chat for p in prompts)
    with gzip.open(datasets_dir() / "humaneval/HumanEval.jsonl.gz", "rt") as f:
        first = json.loads(f.readline())
    assert prompts[0].id == "HumanEval/0" and prompts[0].text == first["prompt"]
    assert len(load_prompts("humaneval,spec_bench", limit=1)) == 1 + 13


def test_stdlib_code_comes_only_from_held_out_files():
    prompts = load_prompts("stdlib_code")
    corpus = Corpus(source="stdlib")
    root = Path(sysconfig.get_paths()["stdlib"]).resolve()
    splits = {p.relative_to(root).as_posix(): split_of(p.relative_to(root).as_posix(), 0.05, 0.05)
              for p in corpus.source_files()}
    assert corpus.fractions["val"] == corpus.fractions["test"] == 0.05  # the defaults the rule above uses
    files = [p.id.removeprefix("stdlib/").split(":")[0] for p in prompts]
    assert {splits[f] for f in files} == {"test"}
    assert len(set(files)) >= 10 and len(prompts) == len({p.id for p in prompts})
    for p in prompts[:20]:
        path, line, _name = p.id.removeprefix("stdlib/").split(":")
        lines = p.text.splitlines()
        assert 1 <= len(lines) <= STDLIB_PROMPT_LINES and lines[0].lstrip().startswith(("def ", "async def "))
        assert p.chat is False and p.category == "stdlib_code"
        source = (root / path).read_text(encoding="utf-8", errors="replace").splitlines()
        assert lines[0].strip() == source[int(line) - 1].strip()
    # round-robin over files: the first prompts come from different files
    assert len(set(files[:5])) == 5
    assert STDLIB_MIN_LINES // 2 <= min(len(p.text.splitlines()) for p in prompts)


def test_missing_datasets_dir_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("WARPDECODE_DATASETS", str(tmp_path))
    with pytest.raises(ConfigError, match="set WARPDECODE_DATASETS") as info:
        load_prompts("spec_bench")
    assert str(tmp_path / "spec_bench/question.jsonl") in str(info.value)


def test_unknown_set_and_bad_limit():
    with pytest.raises(ConfigError, match="unknown prompt set 'mmlu'; choose from: edit, gsm8k, humaneval, spec_bench, stdlib_code"):
        load_prompts("mmlu")
    with pytest.raises(ConfigError, match="--limit must be >= 1"):
        load_prompts("humaneval", limit=0)


def test_typos_swap_inner_letters_deterministically():
    text = "Natalia sold clips to forty-eight of her friends in April, and then she sold half as many clips in May."
    noisy = with_typos(text, seed=3, rate=0.5)
    assert noisy == with_typos(text, seed=3, rate=0.5) and noisy != text
    assert len(noisy) == len(text) and sorted(noisy) == sorted(text)  # letters move, none appear or vanish
    changed = [(a, b) for a, b in zip(text.split(), noisy.split()) if a != b]
    assert changed and all(a[0] == b[0] and a[-1] == b[-1] and sorted(a) == sorted(b) for a, b in changed)


def test_edit_set_corrects_every_gsm8k_test_question():
    prompts = load_prompts("edit")
    rows = [json.loads(line) for line in (datasets_dir() / "gsm8k/test.jsonl").open() if line.strip()]
    assert len(prompts) == len(rows) and {p.category for p in prompts} == {"spelling_correction"}
    assert all(p.text.startswith(EDIT_INSTRUCTION) for p in prompts)
    noisy = prompts[0].text[len(EDIT_INSTRUCTION):]
    assert noisy == with_typos(rows[0]["question"], seed=0) and noisy != rows[0]["question"]


def test_gsm8k_set_is_the_test_questions():
    prompts = load_prompts("gsm8k")
    rows = [json.loads(line) for line in (datasets_dir() / "gsm8k/test.jsonl").open() if line.strip()]
    assert [p.text for p in prompts] == [r["question"] for r in rows]
    assert {p.category for p in prompts} == {"math_word_problems"} and prompts[0].chat is None
