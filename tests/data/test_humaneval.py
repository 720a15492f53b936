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


EXAMPLES = HumanEvalProblem("T/1", '''import math


def add(a, b):
    """ Add two numbers.
    >>> add(1, 2)
    3
    >>> add(0, 0) == 0

    >>> add(x, 1)
    2

    For example:
    add(2, 2) == 4
    add(1, 1) ➞ 2
    add(3, 1) -> 3 + 1 = 4
    add(2, 0) => true
    add(1, 0) should return 1
    add(5, 5) is about ten
    """
''', "", "add", "")


def test_public_tests_are_the_docstrings_examples():
    from warpdecode.data.humaneval import PublicTest, public_tests

    assert public_tests(EXAMPLES) == [
        PublicTest("add(1, 2)", "3"), PublicTest("add(0, 0) == 0", "True"),  # no output after a comparison
        PublicTest("add(2, 2)", "4"), PublicTest("add(1, 1)", "2"), PublicTest("add(3, 1)", "4"),
        PublicTest("add(2, 0)", "True"), PublicTest("add(1, 0)", "1")]  # `add(x, 1)`: x is prose


def test_public_test_program_counts_what_passes_even_when_a_test_hangs():
    from warpdecode.data.humaneval import PublicTest, public_test_fraction, public_test_program

    tests = [PublicTest("f(1)", "1"), PublicTest("f(2)", "2.0"), PublicTest("f(0)", "0"), PublicTest("f(3)", "(3, 3)")]
    programs = [public_test_program("def f(x):\n    return x", tests),
                public_test_program("def f(x):\n    while x == 0:\n        pass\n    return x", tests),
                public_test_program("def f(x):\n    return 1 / x", tests[:1]),
                public_test_program("def f(x):\n    return [x, x] if x == 3 else x", tests)]
    results = run_programs(programs, Limits(wall_seconds=2), workers=2)
    fractions = [public_test_fraction(r.stdout, n) for r, n in zip(results, [4, 4, 1, 4], strict=True)]
    assert fractions == [0.75, 0.5, 1.0, 1.0]  # (3, 3) is not [3, 3] but a list equals a tuple's items


def test_without_examples_keeps_the_description_and_drops_every_example():
    from warpdecode.data.humaneval import without_examples

    lame = without_examples(EXAMPLES.prompt)
    assert lame == 'import math\n\n\ndef add(a, b):\n    """ Add two numbers.\n\n    add(5, 5) is about ten\n    """\n'
    assert without_examples("def f():\n    pass\n") == "def f():\n    pass\n"


def test_canonical_solutions_pass_their_public_tests():
    """HumanEval's examples are right but for three problems whose docstrings are wrong (47: median 15.0
    for 8.0; 116: sorted by value, the solution by bit count; 130: the recurrence's terms, not tri(n))."""
    from warpdecode.data.humaneval import public_test_fraction, public_test_program, public_tests

    problems = [p for p in humaneval_problems() if public_tests(p)]
    assert len(problems) >= 120
    programs = [public_test_program(p.prompt + p.canonical_solution, public_tests(p)) for p in problems]
    results = run_programs(programs, Limits(wall_seconds=10), workers=2)
    wrong = {p.task_id for p, r in zip(problems, results, strict=True)
             if public_test_fraction(r.stdout, len(public_tests(p))) < 1}
    assert wrong == {"HumanEval/47", "HumanEval/116", "HumanEval/130"}
