"""Stop sequences on streamed text: nothing of a stop sequence is ever sent, whatever the increments."""

from __future__ import annotations

import pytest

from warpdecode.decoding.stop_strings import StopMatcher


def run(stops: tuple[str, ...], deltas: list[str]) -> tuple[list[str], bool]:
    matcher = StopMatcher(stops)
    sent = [matcher.push(delta) for delta in deltas]
    return sent + [matcher.flush()], matcher.stopped


def test_text_that_may_start_a_stop_sequence_is_held_back():
    assert run(("END",), ["ab E", "N", "D!"]) == (["ab ", "", "", ""], True)


def test_a_false_start_is_sent_once_it_is_decided():
    assert run(("END",), ["ab E", "Nx", "y"]) == (["ab ", "ENx", "y", ""], False)


def test_without_stop_sequences_everything_is_sent():
    assert run((), ["a", "b"]) == (["a", "b", ""], False)


def test_the_earliest_of_several_stop_sequences_wins():
    assert run(("cd", "bcde"), ["abcdef"]) == (["a", ""], True)


@pytest.mark.parametrize("cut", range(1, 12))
def test_any_split_of_the_text_sends_the_same_answer(cut):
    text = "hello STOP world"
    sent, stopped = run(("STOP", "xyz"), [text[:cut], text[cut:]])
    assert "".join(sent) == "hello " and stopped


def test_nothing_is_sent_after_the_stop():
    matcher = StopMatcher(("!",))
    assert matcher.push("hi!") == "hi" and matcher.push("more") == "" and matcher.flush() == ""
