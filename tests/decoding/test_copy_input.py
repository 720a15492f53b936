"""Input-guided aggressive decoding: alignment with the prompt and copying through edits."""

import pytest

from warpdecode.decoding.drafters.copy_input import CopyInputDrafter, align
from warpdecode.decoding.protocols import AcceptResult, DecodeState
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.errors import ConfigError


def test_align_takes_the_longest_suffix_nearest_to_the_read_position():
    source = [1, 2, 3, 1, 2, 4, 9]
    assert align(source, [7, 1, 2], expected=5, max_ngram=3, near=3) == 5
    assert align(source, [7, 1, 2], expected=1, max_ngram=3, near=3) == 2
    assert align(source, [3, 1, 2], expected=0, max_ngram=3, near=3) == 5  # the 3-gram beats nearness
    assert align(source, [8, 9], expected=6, max_ngram=2, near=3) == 7  # a single token aligns nearby...
    assert align(source, [8, 9], expected=0, max_ngram=2, near=3) is None  # ...but not far away
    assert align(source, [9], expected=0, max_ngram=4, near=3) == 7  # except the output's first token


def simulate(prompt: list[int], answer: list[int], drafter: CopyInputDrafter) -> tuple[int, list[int]]:
    """Greedy verification of the drafter's chains against a known answer; (verify steps, accepted per step)."""
    state = DecodeState(None, None, prompt + answer[:1], len(prompt), Sampler(SamplingConfig()))
    drafter.start(state)
    steps, accepted = 0, []
    while len(state.tokens) - len(prompt) < len(answer):
        tree = drafter.propose(state, budget=64)
        done = len(state.tokens) - len(prompt)
        matched = 0
        for token in tree.tokens.tolist():
            if done + matched < len(answer) and token == answer[done + matched]:
                matched += 1
            else:
                break
        tokens = answer[done : done + matched + 1]
        state.tokens = state.tokens + tokens
        drafter.observe(state, AcceptResult(list(range(matched)), tokens, proposed=tree.depth))
        steps += 1
        accepted.append(matched)
    return steps, accepted


def test_copy_walks_through_substitutions_insertions_and_deletions():
    instruction = [100, 101, 102, 103]
    text = list(range(10, 70))  # 60 tokens of input
    answer = text[:15] + [200] + text[16:30] + [201, 202] + text[30:45] + text[47:]  # sub, insert, delete
    steps, accepted = simulate(instruction + text + [104, 105], answer, CopyInputDrafter(num_tokens=12))
    # 60 tokens in 9 verify steps: the substitution and the deletion cost one partly accepted draft
    # each, the two inserted tokens two rejected drafts; everything else is copied.
    assert accepted == [12, 1, 12, 1, 0, 0, 12, 1, 12]
    assert steps == 9


def test_copy_prefers_order_over_the_latest_repeat():
    """A repeated phrase: prompt lookup would jump to its latest occurrence; the copy continues in order."""
    phrase = [5, 6, 7]
    text = phrase + [20, 21, 22, 23] + phrase + [30, 31, 32, 33]
    steps, accepted = simulate([1] + text, text, CopyInputDrafter(num_tokens=20))
    assert steps == 1 and accepted == [len(text) - 1]


def test_no_draft_when_the_answer_is_not_a_copy():
    """Open-ended answers: after a rejected copy nothing aligns, so the verify forwards carry no draft."""
    prompt = list(range(10, 40))
    answer = [10] + list(range(100, 130))  # starts like the prompt, then goes its own way
    drafter = CopyInputDrafter()
    steps, accepted = simulate(prompt, answer, drafter)
    assert accepted == [0] * steps
    state = DecodeState(None, None, prompt + answer, len(prompt), Sampler(SamplingConfig()))
    assert drafter.propose(state, budget=16).size == 0


def test_invalid_options():
    with pytest.raises(ConfigError, match="max_ngram"):
        CopyInputDrafter(max_ngram=0)
    with pytest.raises(ConfigError, match="num_tokens"):
        CopyInputDrafter(num_tokens=0)
