"""The verifiable tasks: deterministic examples, right answers, checkers, held-out prompts."""

from __future__ import annotations

from itertools import pairwise

import pytest

from warpdecode.data.parallel_tasks import (
    ALPHABET,
    BRACKETS,
    EVAL_RESERVE,
    MAX_ITEMS,
    TASKS,
    evaluation_set,
    example,
    held_out_prompts,
    task_names,
)
from warpdecode.errors import ConfigError


def closes(prefix: str, answer: str) -> bool:
    """Whether prefix + answer is a balanced bracket string."""
    stack: list[str] = []
    for c in prefix + answer:
        if c in BRACKETS:
            stack.append(c)
        elif not stack or BRACKETS[stack.pop()] != c:
            return False
    return not stack


def test_examples_are_a_pure_function_of_task_seed_and_index() -> None:
    assert example("add", 3, 17) == example("add", 3, 17)
    assert len({example("copy", 3, i).payload for i in range(50)}) == 50
    assert evaluation_set("copy,add", per_task=3) == evaluation_set("copy,add", per_task=3)
    assert [e.task for e in evaluation_set("copy,add", per_task=2)] == ["copy", "add", "copy", "add"]


@pytest.mark.parametrize("task", list(TASKS))
def test_reference_answers_are_right_and_fit_the_alphabet(task: str) -> None:
    for i in range(200):
        e = example(task, 0, i)
        assert set(e.prompt + e.answer) <= set(ALPHABET)
        assert 1 <= len(e.answer) <= MAX_ITEMS
        assert e.correct(e.answer)
        p, a = e.payload, e.answer
        if task == "reverse":
            assert a[::-1] == p
        elif task == "sort":
            assert list(a) == sorted(p)
        elif task == "add":
            left, right = p.split("+")
            assert int(a) == int(left) + int(right)
        elif task == "close":
            assert closes(p, a) and not closes(p, "")
        elif task == "fill":
            assert len(a) == len(p) and all(x in ("_", y) for x, y in zip(p, a))
            assert all(ord(y) - ord(x) == 1 for x, y in pairwise(a))


def test_checkers_reject_wrong_answers_and_accept_any_permutation() -> None:
    e = example("reverse", 0, 1)
    assert not e.correct(e.payload + "x") and not e.correct("")
    perm = example("perm", 0, 1)
    assert perm.correct(perm.payload[::-1]) and perm.correct(perm.payload)
    assert not perm.correct(perm.payload[:-1] + perm.payload[0])  # a duplicated letter


def test_held_out_prompts_cover_the_evaluation_set() -> None:
    evaluation = evaluation_set(per_task=20)
    assert {e.prompt for e in evaluation} <= held_out_prompts(list(TASKS))
    assert len(held_out_prompts(["copy"])) == EVAL_RESERVE  # no repeats among them


def test_unknown_tasks_are_refused() -> None:
    assert task_names("all") == list(TASKS) and task_names(" add ,copy") == ["add", "copy"]
    with pytest.raises(ConfigError, match="unknown task"):
        task_names("add,multiply")
