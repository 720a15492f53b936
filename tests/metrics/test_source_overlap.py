"""The source-overlap faithfulness proxy on hand-counted texts."""

import math

import pytest

from warpdecode.metrics.source_overlap import SourceOverlap, words


def test_words_drop_case_and_punctuation():
    assert words("The Zorblat flows north, into Lake Quen.") == ["the", "zorblat", "flows", "north", "into", "lake", "quen"]


def test_the_fraction_of_generated_ngrams_found_in_their_own_source():
    metric = SourceOverlap(2)
    # bigrams: (the river) yes, (river flows) yes, (flows south) no -> 2 of 3; the second pair: (a b) no -> 0 of 1
    metric.update([words("The river flows south"), words("a b")], [words("the river flows north"), words("b a")])
    assert float(metric.compute()) == pytest.approx(2 / 4)
    metric.update([words("b a")], [words("the river flows north")])  # its own source, not the others'
    assert float(metric.compute()) == pytest.approx(2 / 5)


def test_nothing_to_count_is_nan_and_a_bad_order_is_refused():
    metric = SourceOverlap(3)
    metric.update([words("too short")], [words("too short")])
    assert math.isnan(float(metric.compute()))
    with pytest.raises(ValueError, match="n must be"):
        SourceOverlap(0)
