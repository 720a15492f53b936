import pytest

from warpdecode.decoding.drafters.prompt_lookup import PromptLookup, find_continuation
from warpdecode.errors import ConfigError


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
        PromptLookup(max_ngram=1, min_ngram=2)
