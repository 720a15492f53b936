from types import SimpleNamespace

import pytest

from warpdecode.decoding.drafters.prompt_lookup import PromptLookupDrafter, longest_match, scaled_length
from warpdecode.errors import ConfigError


def find_continuation(tokens: list[int], max_ngram: int, min_ngram: int, num_tokens: int) -> list[int]:
    """The full chain prompt lookup proposes after `tokens`."""
    lookup = PromptLookupDrafter(max_ngram, min_ngram, num_tokens, scale=False)
    return lookup.propose(SimpleNamespace(tokens=tokens), budget=64).tokens.tolist()  # type: ignore[arg-type]


def test_longest_suffix_most_recent_match():
    tokens = [1, 2, 3, 4, 9, 2, 3, 5, 6, 1, 2, 3]
    # suffix [1, 2, 3] occurs at 0 → continue with 4, 9, 2
    assert find_continuation(tokens, max_ngram=3, min_ngram=1, num_tokens=3) == [4, 9, 2]
    # with bigrams only, the most recent [2, 3] (at 5) wins
    assert find_continuation(tokens, max_ngram=2, min_ngram=1, num_tokens=3) == [5, 6, 1]


def test_no_match_proposes_nothing():
    assert find_continuation([1, 2, 3, 4], max_ngram=3, min_ngram=1, num_tokens=5) == []


def test_continuation_is_cut_at_the_sequence_end():
    assert find_continuation([7, 8, 7], max_ngram=1, min_ngram=1, num_tokens=5) == [8, 7]


def test_invalid_options():
    with pytest.raises(ConfigError, match="min_ngram"):
        PromptLookupDrafter(max_ngram=1, min_ngram=2)


def test_longest_match_reports_its_length_and_where_the_copy_starts():
    tokens = [1, 2, 3, 4, 9, 2, 3, 5, 6, 1, 2, 3]
    assert longest_match(tokens, max_ngram=3, min_ngram=1) == (3, 3)
    assert longest_match(tokens, max_ngram=2, min_ngram=1) == (2, 7)
    assert longest_match([1, 2, 3, 4], max_ngram=3, min_ngram=1) == (0, 0)


@pytest.mark.parametrize("n, expected", [(1, 4), (2, 7), (3, 10)])
def test_scaled_length_grows_with_the_match(n, expected):
    assert scaled_length(10, n, 3) == expected


def test_scaled_lookup_proposes_shorter_chains_after_shorter_matches():
    one_token_match = [5, 1, 2, 3, 4, 6, 7, 8, 9, 8, 5]  # only [5] recurs
    three_token_match = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    for tokens, scaled in ((one_token_match, [1, 2, 3, 4]), (three_token_match, [4, 5, 6, 7, 8, 9, 1, 2, 3])):
        state = SimpleNamespace(tokens=tokens)
        plain = PromptLookupDrafter(num_tokens=10, scale=False).propose(state, budget=64)  # type: ignore[arg-type]
        cut = PromptLookupDrafter(num_tokens=10).propose(state, budget=64)  # type: ignore[arg-type]
        assert cut.tokens.tolist() == scaled
        assert plain.tokens.tolist()[: len(scaled)] == scaled
    assert PromptLookupDrafter(num_tokens=10).propose(
        SimpleNamespace(tokens=three_token_match), budget=2).tokens.tolist() == [4, 5]  # type: ignore[arg-type]
