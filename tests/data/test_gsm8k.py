"""GSM8K answer extraction on fixed strings, and the reference numbers of the test split."""

import pytest

from warpdecode.data.gsm8k import extract_answer, final_number, gsm8k_problems


@pytest.mark.parametrize("text, answer", [
    ("She sells 16 - 3 - 4 = 9 eggs, 9 * 2 = 18.\n#### 18", "18"),
    ("#### 1,200.00", "1200"),
    ("So 5 + 7 = 12. The answer is 12.", "12"),
    ("The answer is: $1,050. That took 3 steps.", "1050"),          # the stated answer beats a later number
    ("First 3 apples, then 4 more, 7 in all", "7"),                   # no marker: the last number
    ("The answer is 4. Check: 2 + 2 = 4. the answer is -3.50", "-3.5"),  # the last statement
    ("#### 42\nThe answer is 41", "42"),                              # the dataset's marker first
    ("no numbers here", None),
    ("", None),
])
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


def test_final_number_normalises():
    assert final_number("it costs $1,200.50 or 3.0") == "3"


def test_the_test_split_references():
    problems = gsm8k_problems(limit=3)
    assert [p.reference for p in problems] == ["18", "3", "70000"]
    assert problems[0].id == "gsm8k/test-0" and problems[0].question.startswith("Janet")
