"""Named benchmark prompt sets, read from the evaluation sets in `$WARPDECODE_DATASETS`.

| set | prompts | categories |
|---|---|---|
| `spec_bench` | first turn of each Spec-Bench question, chat template applied | the file's `category` field |
| `humaneval` | HumanEval `prompt` as raw code completion (no chat template) | `humaneval` |
| `stdlib_code` | the first lines of functions from held-out standard-library files, raw completion | `stdlib_code` |
| `edit` | GSM8K test questions with seeded spelling mistakes, to be corrected (an input-grounded task), chat template applied | `spelling_correction` |
| `gsm8k` | GSM8K test questions, chat template applied (the domain of the drafter recipes' GSM8K *train* prompts) | `math_word_problems` |

`WARPDECODE_DATASETS` defaults to `<repo>/../shared/datasets`. `stdlib_code` reads only files of the
`test` split of `data.corpus.Corpus(source="stdlib")` (same hash rule, same default fractions), so no
file that the stdlib training recipes train on becomes a prompt.
"""

from __future__ import annotations

import gzip
import json
import random
import re
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

from warpdecode.data.corpus import stdlib_split_files
from warpdecode.data.datasets import dataset_file
from warpdecode.data.gsm8k import gsm8k_rows
from warpdecode.data.stdlib import functions, parse, split_sources
from warpdecode.errors import ConfigError

STDLIB_MIN_LINES = 16
"""Functions shorter than this are not used: at least half of each function is left to complete."""
STDLIB_PROMPT_LINES = 40
"""Prompt = the first min(40, n // 2) lines of an n-line function (decorators excluded)."""


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    category: str
    text: str
    chat: bool | None
    """Wrap in the chat template: True, False, or None (when the model has one)."""


_SETS: dict[str, Callable[[], list[BenchPrompt]]] = {}


def prompt_set(name: str) -> Callable[[Callable[[], list[BenchPrompt]]], Callable[[], list[BenchPrompt]]]:
    """Register a loader of a named prompt set."""

    def wrap(loader: Callable[[], list[BenchPrompt]]) -> Callable[[], list[BenchPrompt]]:
        _SETS[name] = loader
        return loader

    return wrap


def names() -> list[str]:
    return sorted(_SETS)


def load_prompts(spec: str, *, limit: int | None = None, categories: str | None = None) -> list[BenchPrompt]:
    """Prompts of one or more comma-separated sets, at most `limit` per category (file order kept),
    only of the comma-separated `categories` when given."""
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {limit}")
    wanted = None if categories is None else {c.strip() for c in categories.split(",") if c.strip()}
    out: list[BenchPrompt] = []
    seen: set[str] = set()
    for name in (part.strip() for part in spec.split(",")):
        if name not in _SETS:
            raise ConfigError(f"unknown prompt set {name!r}; choose from: {', '.join(names())}")
        taken: dict[str, int] = {}
        for prompt in _SETS[name]():
            seen.add(prompt.category)
            if wanted is not None and prompt.category not in wanted:
                continue
            if limit is None or taken.get(prompt.category, 0) < limit:
                taken[prompt.category] = taken.get(prompt.category, 0) + 1
                out.append(prompt)
    if wanted is not None and wanted - seen:
        raise ConfigError(f"unknown categor{'y' if len(wanted - seen) == 1 else 'ies'} {', '.join(sorted(wanted - seen))} "
                          f"in {spec}; choose from: {', '.join(sorted(seen))}")
    return out


@prompt_set("spec_bench")
def spec_bench() -> list[BenchPrompt]:
    path = dataset_file("spec_bench/question.jsonl")
    prompts = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                prompts.append(BenchPrompt(f"spec_bench/{row['question_id']}", row["category"], row["turns"][0], None))
    return prompts


@prompt_set("humaneval")
def humaneval() -> list[BenchPrompt]:
    path = dataset_file("humaneval/HumanEval.jsonl.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [BenchPrompt(row["task_id"], "humaneval", row["prompt"], False) for row in rows]


def held_out_stdlib_files() -> list[tuple[str, Path]]:
    """(relative path, path) of the stdlib corpus files in the `test` split, sorted."""
    return stdlib_split_files("test")


def _function_prompts(key: str, source: str) -> Iterator[BenchPrompt]:
    lines = source.splitlines(keepends=True)
    for node in functions(parse(source)):
        if node.end_lineno is not None:
            n = node.end_lineno - node.lineno + 1
            if n >= STDLIB_MIN_LINES:
                head = lines[node.lineno - 1 : node.lineno - 1 + min(STDLIB_PROMPT_LINES, n // 2)]
                yield BenchPrompt(f"stdlib/{key}:{node.lineno}:{node.name}", "stdlib_code",
                                  textwrap.dedent("".join(head)), False)


@prompt_set("stdlib_code")
def stdlib_code() -> list[BenchPrompt]:
    """Every function of >= 16 lines in the held-out files, taken round-robin over files so that a
    `--limit` spreads over many files."""
    per_file = [sorted(_function_prompts(key, source), key=lambda p: int(p.id.split(":")[-2]))
                for key, source in split_sources("test")]
    return [p for group in zip_longest(*per_file) for p in group if p is not None]


EDIT_INSTRUCTION = "Correct the spelling mistakes in the following text. Reply with the corrected text only.\n\n"
EDIT_TYPO_RATE = 0.15
"""Share of words of 4+ letters that get two adjacent inner letters swapped."""


def gsm8k_test_rows() -> list[dict[str, str]]:
    """GSM8K test rows: `question`, and `answer` (worked solution ending in `#### <number>`)."""
    return gsm8k_rows("test")


def gsm8k_test_questions() -> list[str]:
    return [row["question"] for row in gsm8k_test_rows()]


@prompt_set("gsm8k")
def gsm8k() -> list[BenchPrompt]:
    """GSM8K test questions (evaluation only; drafters train on the train split)."""
    return [BenchPrompt(f"gsm8k/test-{i}", "math_word_problems", q, None) for i, q in enumerate(gsm8k_test_questions())]


def with_typos(text: str, seed: int, rate: float = EDIT_TYPO_RATE) -> str:
    """`text` with two adjacent inner letters swapped in about `rate` of its words of 4+ letters;
    deterministic in `seed`. Example: "question" may become "quesiton"."""
    rng = random.Random(seed)

    def swap(match: re.Match[str]) -> str:
        word = match.group(0)
        if rng.random() >= rate:
            return word
        i = rng.randrange(1, len(word) - 2)
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]

    return re.sub(r"[A-Za-z]{4,}", swap, text)


@prompt_set("edit")
def edit() -> list[BenchPrompt]:
    """Spelling correction of GSM8K test questions (real text; only the questions, never the
    answers, and only as evaluation prompts): the answer is nearly a copy of the input."""
    return [BenchPrompt(f"edit/gsm8k-test-{index}", "spelling_correction",
                        EDIT_INSTRUCTION + with_typos(question, seed=index), None)
            for index, question in enumerate(gsm8k_test_questions())]
