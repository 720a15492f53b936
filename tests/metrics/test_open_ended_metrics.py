"""Open-ended generation metrics against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from warpdecode.metrics.open_ended import DistinctN, RepetitionRate, SelfBLEU, TypeTokenRatio, WordIds


def test_distinct_n_pools_ngrams_over_sequences():
    metric = DistinctN(2)
    metric.update([[1, 2, 3], torch.tensor([1, 2, 1, 2])])  # bigrams 12 23 | 12 21 12 → 3 distinct of 5
    metric.update([[7]])  # too short: no bigram
    assert metric.compute().item() == pytest.approx(3 / 5)


def test_repetition_rate_is_zero_without_repeats_and_high_for_a_loop():
    metric = RepetitionRate(2)
    metric.update([[1, 2, 3, 4], [5, 6, 5, 6, 5, 6]])  # 0 and 1 - 2/5
    assert metric.compute().item() == pytest.approx((0 + 3 / 5) / 2)
    looping = RepetitionRate(4)
    looping.update([[1, 2, 3] * 40])
    assert looping.compute().item() > 0.97


def test_type_token_ratio_averages_per_sequence():
    metric = TypeTokenRatio()
    metric.update([[1, 1, 2, 2], [3, 4, 5]])
    assert metric.compute().item() == pytest.approx((2 / 4 + 1) / 2)


def test_self_bleu_is_one_for_identical_and_low_for_disjoint_sequences():
    same = SelfBLEU(2)
    same.update([[1, 2, 3, 4, 5]] * 3)
    assert same.compute().item() == pytest.approx(1.0)
    disjoint = SelfBLEU(2)
    disjoint.update([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]])
    assert disjoint.compute().item() < 0.25
    alone = SelfBLEU(2)
    alone.update([[1, 2, 3]])
    assert math.isnan(alone.compute().item())


def test_empty_metrics_are_nan_and_reset_forgets():
    metric = DistinctN(1)
    assert math.isnan(metric.compute().item())
    metric.update([[1, 1]])
    metric.reset()
    metric.update([[1, 2]])
    assert metric.compute().item() == 1.0


def test_word_ids_are_stable_across_texts():
    words = WordIds()
    assert words("the cat the") == [0, 1, 0]
    assert words("a  cat\nsat") == [2, 1, 3]
