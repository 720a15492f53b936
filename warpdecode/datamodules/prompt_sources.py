"""The prompt sources of the self-distillation data, and how a prompt set is drawn from them.

A source is a list of prompts: built-in ones read from disk (`SOURCES`: GSM8K train questions, "Write a
Python function ..." prompts from the stdlib's docstrings, the instruction sources of
`datamodules/instructions.py`), the target's own user turns (`self_chat`, `datamodules/self_chat.py`),
or a JSONL file. `load_prompts` interleaves them, round-robin or by weight, into one prompt set;
`source_stamp` says what a source's prompts depend on, so a cache keyed by it notices a change without
building them. The answers' cache is keyed by prompt text: a change to a source's texts is a new set.
"""

from __future__ import annotations

import ast
import json
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from warpdecode.data.corpus import read_jsonl
from warpdecode.data.datasets import dataset_file
from warpdecode.data.stdlib import api_functions, parse, split_sources, stdlib_stamp
from warpdecode.datamodules.instructions import INSTRUCTION_SOURCES
from warpdecode.datamodules.instructions import source_stamp as instruction_stamp
from warpdecode.datamodules.prompt import DistillPrompt
from warpdecode.datamodules.self_chat import SOURCE as SELF_CHAT
from warpdecode.datamodules.self_chat import VERSION as SELF_CHAT_VERSION
from warpdecode.datamodules.self_chat import SelfChatSource
from warpdecode.errors import ConfigError
from warpdecode.io import atomic_file

DOCSTRING_MIN_CHARS = 24
"""Shorter first paragraphs ("Return x.") say too little to write a function from."""


def gsm8k_train_prompts() -> list[DistillPrompt]:
    """The questions of the GSM8K train split (never the test split, which the bench evaluates on)."""
    with dataset_file("gsm8k/train.jsonl").open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [DistillPrompt(f"gsm8k_train/{i}", (("user", row["question"]),)) for i, row in enumerate(rows)]


def docstring_prompts(key: str, source: str) -> Iterator[DistillPrompt]:
    """A prompt "Write a Python function `name(args)`: <first docstring paragraph>" for each public
    function or method of one file whose first docstring paragraph has `DOCSTRING_MIN_CHARS` chars or more."""
    for node, owner in api_functions(parse(source)):
        paragraph = " ".join((ast.get_docstring(node) or "").split("\n\n")[0].split())
        if node.name.startswith("_") or len(paragraph) < DOCSTRING_MIN_CHARS:
            continue
        kind, name = ("function", node.name) if owner is None else ("method", f"{owner}.{node.name}")
        text = f"Write a Python {kind} `{name}({ast.unparse(node.args)})`: {paragraph}"
        yield DistillPrompt(f"stdlib/{key}:{node.lineno}:{name}", (("user", text),))


def stdlib_docstring_prompts() -> list[DistillPrompt]:
    """Docstring prompts of every train-split stdlib file, in file then line order."""
    return [prompt for key, source in split_sources("train") for prompt in docstring_prompts(key, source)]


SOURCES: dict[str, Callable[[], list[DistillPrompt]]] = {
    "gsm8k_train": gsm8k_train_prompts,
    "stdlib_docstrings": stdlib_docstring_prompts,
    **INSTRUCTION_SOURCES,
}
"""Built-in prompt sources read from disk, by name. `self_chat` (the target's own user turns,
`datamodules/self_chat.py`) is built in too but needs the target; any other source is a `.jsonl` path."""


def _messages(record: Any, where: str) -> tuple[tuple[str, str], ...]:
    if isinstance(record, dict) and isinstance(record.get("prompt"), str):
        return (("user", record["prompt"]),)
    turns = record.get("messages") if isinstance(record, dict) else None
    if isinstance(turns, list) and turns and all(isinstance(t, dict) for t in turns):
        pairs = [(t.get("role"), t.get("content")) for t in turns]
        if all(isinstance(r, str) and isinstance(c, str) for r, c in pairs) and pairs[-1][0] == "user":
            return tuple(pairs)
    raise ConfigError(f'{where}: expected {{"prompt": str}} or '
                      '{"messages": [{"role": str, "content": str}, ...]} ending with a user turn')


def jsonl_prompts(path: Path) -> list[DistillPrompt]:
    """One prompt per non-blank line of a JSONL file, in file order."""
    return [DistillPrompt(f"{path.name}/{line_no}", _messages(record, f"{path}:{line_no}"))
            for line_no, record in read_jsonl(path)]


def write_jsonl_prompts(path: Path, prompts: Sequence[DistillPrompt]) -> None:
    """One `{"messages": [...]}` line per prompt, in order, written atomically: `jsonl_prompts` reads
    the same texts back, so the file gives the same train/val split and finds the same cached answers."""
    lines = [json.dumps({"messages": [{"role": role, "content": content} for role, content in p.messages]},
                        ensure_ascii=False) + "\n" for p in prompts]
    atomic_file(path, lambda f: f.write("".join(lines).encode()))


def check_source(source: str) -> None:
    if source in SOURCES or source == SELF_CHAT:
        return
    if not source.endswith(".jsonl"):
        raise ConfigError(f"unknown prompt source {source!r}; choose from {', '.join([*SOURCES, SELF_CHAT])} "
                          "or a path to a .jsonl file")
    if not Path(source).is_file():
        raise ConfigError(f"prompt file {source} not found")


def check_weights(sources: list[str], weights: dict[str, float]) -> None:
    for source, weight in weights.items():
        if source not in sources:
            raise ConfigError(f"prompt weight for {source!r}, which is not one of the prompt sources {sources}")
        if not weight > 0:
            raise ConfigError(f"prompt weights must be > 0, got {weight} for {source!r}")


def interleave(lists: Sequence[Sequence[DistillPrompt]], weights: Sequence[float],
               limit: int) -> Iterator[tuple[int, DistillPrompt]]:
    """(source index, prompt), `limit` prompts at most, none repeated: source i's k-th prompt comes at
    time k / weights[i], earlier sources first at equal times. Each source's share of every stretch is
    in proportion to its weight; equal weights give round-robin (`zip_longest` order); an exhausted
    source drops out and the others go on in the same rhythm."""
    cursors, seen, taken = [0] * len(lists), set(), 0
    while taken < limit:
        alive = [i for i, prompts in enumerate(lists) if cursors[i] < len(prompts)]
        if not alive:
            return
        pick = min(alive, key=lambda i: ((cursors[i] + 1) / weights[i], i))
        prompt = lists[pick][cursors[pick]]
        cursors[pick] += 1
        if prompt.messages not in seen:
            seen.add(prompt.messages)
            taken += 1
            yield pick, prompt


class _Unbounded(Sequence[DistillPrompt]):
    """A stand-in source that never runs out (to count how much of a generated source a mix takes)."""

    def __len__(self) -> int:
        return sys.maxsize

    def __getitem__(self, index: Any) -> Any:
        return DistillPrompt(f"unbounded/{index}", (("user", f"\0{index}"),))


def generated_share(lists: Sequence[Sequence[DistillPrompt] | None], weights: Sequence[float],
                    max_prompts: int) -> int:
    """How many prompts `interleave` takes from the generated source (the one None entry of `lists`,
    taken as unbounded) to reach `max_prompts` (duplicates among the other sources taken as they come)."""
    generated = lists.index(None)
    stand_ins = [_Unbounded() if prompts is None else prompts for prompts in lists]
    return sum(source == generated for source, _ in interleave(stand_ins, weights, max_prompts))


def load_prompts(sources: list[str], max_prompts: int, seed: int, self_chat: SelfChatSource | None = None,
                 weights: dict[str, float] | None = None) -> list[DistillPrompt]:
    """The first `max_prompts` distinct prompts, interleaved over the sources so that a cut keeps a
    mix: round-robin, or in proportion to `weights` (source → weight, 1 for a source not named).
    Built-in sources are shuffled with `seed` (their own order is by file and line); a JSONL file and
    `self_chat` keep their order. The `self_chat` source needs the `self_chat` argument (the target
    that writes it), and writes as many user turns as its share of the mix."""
    weights = weights or {}
    check_weights(sources, weights)
    lists: dict[str, list[DistillPrompt]] = {}
    for source in sources:
        check_source(source)
        if source in SOURCES:
            lists[source] = SOURCES[source]()
            random.Random(f"{seed}:{source}").shuffle(lists[source])
        elif source != SELF_CHAT:
            lists[source] = jsonl_prompts(Path(source))
    shares = [weights.get(s, 1.0) for s in sources]
    if SELF_CHAT in sources:
        if self_chat is None:
            raise ConfigError("the self_chat prompt source needs the target to write its prompts")
        lists[SELF_CHAT] = self_chat.prompts(generated_share([lists.get(s) for s in sources], shares, max_prompts))
    chosen = [prompt for _, prompt in interleave([lists[s] for s in sources], shares, max_prompts)]
    if not chosen:
        raise ConfigError(f"the prompt sources {sources} hold no prompt")
    return chosen


def file_stamp(path: Path) -> list[Any]:
    """Which file, and its size and modification time: changes when the file does."""
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


def source_stamp(source: str) -> list[Any]:
    """What a source's prompts depend on, without reading it."""
    if source == "gsm8k_train":
        return file_stamp(dataset_file("gsm8k/train.jsonl"))
    if source == "stdlib_docstrings":
        return [source, *stdlib_stamp()]
    if source in INSTRUCTION_SOURCES:
        return instruction_stamp(source)
    if source == SELF_CHAT:  # written by the target, whose files the run key stamps already
        return [source, SELF_CHAT_VERSION]
    return file_stamp(Path(source))
