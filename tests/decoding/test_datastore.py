"""The retrieval datastore: longest-suffix lookup against a brute-force scan."""

import numpy as np
import pytest

from warpdecode.decoding.datastore import Datastore
from warpdecode.errors import ConfigError


def brute_force(stream: list[int], context: list[int], depth: int, max_ngram: int) -> tuple[int, set[tuple[int, ...]]]:
    for n in range(min(max_ngram, len(context)), 1, -1):
        suffix = context[-n:]
        starts = [i for i in range(len(stream) - n + 1) if stream[i : i + n] == suffix]
        if starts:
            return n, {tuple(stream[s + n : s + n + depth]) for s in starts}
    return 0, set()


@pytest.mark.parametrize("seed", range(5))
def test_longest_suffix_continuations_match_a_brute_force_scan(seed):
    rng = np.random.default_rng(seed)
    stream = rng.integers(0, 6, size=400).tolist()
    store = Datastore.build(np.array(stream), vocab_size=6)
    for _ in range(20):
        context = rng.integers(0, 6, size=7).tolist()
        matched, rows = store.continuations(context, depth=3, max_matches=1000, max_ngram=5)
        expected_n, expected_rows = brute_force(stream, context, depth=3, max_ngram=5)
        assert matched == expected_n
        assert {tuple(t for t in row if t >= 0) for row in rows.tolist()} == expected_rows


def test_matches_are_capped_and_padded_at_the_end():
    store = Datastore.build(np.array([1, 2, 3, 1, 2, 4, 1, 2]), vocab_size=5)
    matched, rows = store.continuations([1, 2], depth=2, max_matches=2, max_ngram=4)
    assert matched == 2
    assert rows.tolist() == [[-1, -1], [4, 1]]  # most recent occurrence first; it ends the stream
    assert store.continuations([0, 0], depth=2, max_matches=2, max_ngram=4)[1].shape == (0, 2)


def test_rejects_ids_outside_the_vocabulary():
    with pytest.raises(ConfigError, match="another tokenizer"):
        Datastore.build(np.array([1, 2, 9]), vocab_size=5)
