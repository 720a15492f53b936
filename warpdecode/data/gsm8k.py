"""GSM8K (Cobbe et al. 2021): the problems, their reference numbers, and the final answer of a model's
solution.

`extract_answer` reads, in order of preference: the number after the last `####` (the dataset's own
marker), the number after the last "the answer is" (the chain-of-thought papers' phrase, which the
prompt asks for), or else the last number of the text. Numbers lose thousands separators, a leading
`$` and trailing zeros after the point ("$1,200.00" → "1200"), so they compare as text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from warpdecode.data.datasets import dataset_file
from warpdecode.errors import ConfigError

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
ANSWER_IS = re.compile(r"answer\s+is\s*:?\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?)", re.IGNORECASE)
INSTRUCTION = "{question}\nSolve the problem step by step. End with: The answer is <number>."


@dataclass(frozen=True)
class GSM8KProblem:
    id: str
    question: str
    reference: str
    """The reference final number, normalised like extracted answers."""


def gsm8k_rows(split: str = "test") -> list[dict[str, str]]:
    """GSM8K rows of `split` (test or train): `question`, and `answer` (a worked solution ending in `#### <number>`)."""
    if split not in ("test", "train"):
        raise ConfigError(f"GSM8K has the splits test and train, not {split!r}")
    with dataset_file(f"gsm8k/{split}.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def gsm8k_problems(limit: int | None = None) -> list[GSM8KProblem]:
    """The first `limit` test problems (all 1,319 by default)."""
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {limit}")
    rows = gsm8k_rows("test")[:limit]
    return [GSM8KProblem(f"gsm8k/test-{i}", row["question"], _reference(row["answer"])) for i, row in enumerate(rows)]


def _reference(answer: str) -> str:
    number = final_number(answer.rsplit("####", 1)[-1])
    if number is None:
        raise ConfigError(f"a GSM8K answer without a final number after ####: {answer[-80:]!r}")
    return number


def normalise_number(number: str) -> str:
    """"1,200.00" → "1200", "-3.50" → "-3.5"."""
    number = number.replace(",", "")
    if "." in number:
        number = number.rstrip("0").rstrip(".")
    return number


def final_number(text: str) -> str | None:
    """The last number of `text`, normalised: "… $1,200.00" → "1200"."""
    found = NUMBER.findall(text)
    return normalise_number(found[-1]) if found else None


def extract_answer(text: str) -> str | None:
    """The final answer of a solution: after `####`, else after "the answer is", else the last number."""
    if "####" in text:
        found = NUMBER.search(text.rsplit("####", 1)[1])
        if found:
            return normalise_number(found.group())
    stated = ANSWER_IS.findall(text)
    if stated:
        return normalise_number(stated[-1])
    return final_number(text)
