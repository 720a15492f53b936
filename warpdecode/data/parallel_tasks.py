"""ParallelBench-style verifiable tasks: short problems with exact answers where parallel decoding fails.

Each task writes a prompt `NAME:PAYLOAD=` and has one checker for the answer. The tasks are trivial
for a left-to-right decoder and hard for a diffusion LM that commits several positions at once
from per-position marginals (ParallelBench's point): a reversed string or a carry chain needs the
positions to agree with each other, and `perm` has many right answers, so committing positions
independently produces duplicated or missing letters.

| task | prompt → answer | what parallel decoding gets wrong |
|---|---|---|
| `copy` | `copy:k3j9a=` → `k3j9a` | little: every position is determined by the prompt |
| `reverse` | `reverse:abcd=` → `dcba` | position alignment |
| `sort` | `sort:3918=` → `1389` | counting: which digit goes where depends on all others |
| `add` | `add:347+85=` → `432` | carries couple neighbouring digits |
| `close` | `close:([]{(=` → `)})` | the number of closers depends on the whole prefix |
| `fill` | `fill:d_f_h=` → `defgh` | neighbours constrain each other (a consecutive run) |
| `perm` | `perm:abcde=` → any permutation | many answers: independent commits duplicate letters |

Examples are a pure function of (task, seed, index), so the evaluation set (`evaluation_set`) is the
same on every machine and the training data (`datamodules/parallel_tasks.py`) excludes its prompts.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass

from warpdecode.errors import ConfigError

ALPHABET = string.ascii_lowercase + string.digits + "()[]{}+=:_"
"""Every character a prompt or answer of these tasks uses."""
EVAL_SEED = 20_251_006
"""Seed of the evaluation examples (never trained on)."""
MAX_ITEMS = 12
"""Longest payload of the list tasks; answers are at most 12 characters."""
BRACKETS = {"(": ")", "[": "]", "{": "}"}


@dataclass(frozen=True)
class TaskExample:
    task: str
    payload: str
    answer: str
    """The reference answer (for `perm`, one of many right ones)."""

    @property
    def prompt(self) -> str:
        return f"{self.task}:{self.payload}="

    def correct(self, output: str) -> bool:
        return TASKS[self.task].check(self.payload, output, self.answer)

    def encode(self, vocab: dict[str, int], eos_token_id: int, gen_length: int) -> tuple[list[int], int]:
        """(prompt + answer + end-of-text padding up to `gen_length` answer positions, prompt length):
        the layout a diffusion LM trains and is scored on (`vocab`: a character tokenizer's)."""
        prompt = [vocab[c] for c in self.prompt]
        answer = [vocab[c] for c in self.answer]
        return prompt + answer + [eos_token_id] * (gen_length - len(answer)), len(prompt)


def _exact(payload: str, output: str, answer: str) -> bool:
    return output == answer


def _is_permutation(payload: str, output: str, answer: str) -> bool:
    return sorted(output) == sorted(payload)


@dataclass(frozen=True)
class Task:
    make: Callable[[random.Random], tuple[str, str]]
    """rng → (payload, reference answer)."""
    check: Callable[[str, str, str], bool] = _exact
    """(payload, output, reference) → whether the output is right."""


def _length(rng: random.Random, low: int = 4) -> int:
    return rng.randint(low, MAX_ITEMS)


def _copy(rng: random.Random) -> tuple[str, str]:
    s = "".join(rng.choices(string.ascii_lowercase + string.digits, k=_length(rng)))
    return s, s


def _reverse(rng: random.Random) -> tuple[str, str]:
    s = "".join(rng.choices(string.ascii_lowercase, k=_length(rng)))
    return s, s[::-1]


def _sort(rng: random.Random) -> tuple[str, str]:
    s = "".join(rng.choices(string.digits, k=_length(rng)))
    return s, "".join(sorted(s))


def _add(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randrange(10 ** rng.randint(1, 4)), rng.randrange(10 ** rng.randint(1, 4))
    return f"{a}+{b}", str(a + b)


def _close(rng: random.Random) -> tuple[str, str]:
    """A random bracket prefix with at least one bracket left open; the answer closes them innermost first."""
    out: list[str] = []
    stack: list[str] = []
    for _ in range(rng.randint(2, MAX_ITEMS)):
        if stack and rng.random() < 0.4:
            out.append(BRACKETS[stack.pop()])
        else:
            stack.append(rng.choice(list(BRACKETS)))
            out.append(stack[-1])
    if not stack:
        stack.append(rng.choice(list(BRACKETS)))
        out.append(stack[-1])
    return "".join(out), "".join(BRACKETS[o] for o in reversed(stack))


def _fill(rng: random.Random) -> tuple[str, str]:
    """A run of consecutive letters with some blanked out (never the first); the answer is the run."""
    n = _length(rng, 5)
    start = rng.randrange(26 - n + 1)
    run = string.ascii_lowercase[start : start + n]
    blanks = rng.sample(range(1, n), k=rng.randint(1, n // 2))
    return "".join("_" if i in blanks else c for i, c in enumerate(run)), run


def _perm(rng: random.Random) -> tuple[str, str]:
    letters = rng.sample(string.ascii_lowercase, k=_length(rng))
    shuffled = letters[:]
    rng.shuffle(shuffled)
    return "".join(sorted(letters)), "".join(shuffled)


TASKS: dict[str, Task] = {
    "copy": Task(_copy),
    "reverse": Task(_reverse),
    "sort": Task(_sort),
    "add": Task(_add),
    "close": Task(_close),
    "fill": Task(_fill),
    "perm": Task(_perm, _is_permutation),
}


def task_names(spec: str | None) -> list[str]:
    """`"copy,add"` → those tasks (checked); None or `"all"` → every task."""
    if spec is None or spec == "all":
        return list(TASKS)
    chosen = [name.strip() for name in spec.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in TASKS]
    if unknown or not chosen:
        raise ConfigError(f"unknown task(s) {unknown or spec!r}; choose from {', '.join(TASKS)} or all")
    return chosen


def example(task: str, seed: int, index: int) -> TaskExample:
    """The `index`-th example of `task` under `seed` (independent of every other index)."""
    rng = random.Random(f"{task}/{seed}/{index}")
    payload, answer = TASKS[task].make(rng)
    return TaskExample(task, payload, answer)


def evaluation_set(tasks: str | None = None, per_task: int = 50) -> list[TaskExample]:
    """The held-out examples: the first `per_task` of each task under `EVAL_SEED`, tasks interleaved."""
    names = task_names(tasks)
    return [example(name, EVAL_SEED, i) for i in range(per_task) for name in names]


EVAL_RESERVE = 500
"""Evaluation examples per task the training data never contains (`evaluation_set` uses a prefix)."""


def held_out_prompts(tasks: list[str]) -> set[str]:
    return {example(name, EVAL_SEED, i).prompt for name in tasks for i in range(EVAL_RESERVE)}
