"""HumanEval candidates: truncation at the stop sequences, chat replies, and the test program in the sandbox."""

import pytest

from warpdecode.data.humaneval import (
    HumanEvalProblem,
    chat_candidate,
    check_program,
    humaneval_problems,
    truncate_completion,
)
from warpdecode.sandbox import Limits, run_programs

PROBLEM = HumanEvalProblem("T/0", "import math\n\n\ndef area(r):\n    \"\"\"Area of a circle.\"\"\"\n",
                           "def check(candidate):\n    assert abs(candidate(1) - math.pi) < 1e-9\n", "area", "")


@pytest.mark.parametrize("completion, kept", [
    ("    return x\n\ndef main():\n    pass", "    return x\n"),
    ("    return x\n\n\nif __name__ == '__main__':\n    main()", "    return x\n\n"),
    ("    return x\n# tests\nprint(f(1))", "    return x"),
    ("    return x\nclass A:\n    pass", "    return x"),
    ("    return x\n```\nThat is all.", "    return x"),
    ("    return x\n@decorator\ndef g(): pass", "    return x"),
    ("    # a comment inside\n    if x:\n        print(x)\n    return x", "    # a comment inside\n    if x:\n        print(x)\n    return x"),
    ("", ""),
])
def test_a_completion_is_cut_at_the_first_stop_sequence_at_column_0(completion, kept):
    assert truncate_completion(completion) == kept


def test_a_chat_reply_gives_its_first_code_block_after_the_prompts_imports():
    reply = "Sure!\n```python\ndef area(r):\n    return math.pi * r * r\n```\nAnd another:\n```python\nx = 1\n```"
    assert chat_candidate(PROBLEM, reply) == "import math\n\ndef area(r):\n    return math.pi * r * r\n"


def test_a_chat_reply_with_only_a_body_follows_the_whole_prompt():
    assert chat_candidate(PROBLEM, "```\n    return math.pi * r ** 2\n```") == PROBLEM.prompt + "    return math.pi * r ** 2\n"


def test_the_canonical_solutions_pass_and_wrong_ones_fail():
    problems = humaneval_problems(limit=3)
    assert [p.task_id for p in problems] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    right = [check_program(p, p.prompt + p.canonical_solution) for p in problems]
    wrong = [check_program(p, p.prompt + "    return None\n") for p in problems]
    results = run_programs(right + wrong, Limits(wall_seconds=10), workers=2)
    assert [r.status for r in results] == ["passed"] * 3 + ["failed"] * 3
