"""pass@k against values computed by hand from 1 - C(n-c, k) / C(n, k)."""

from math import comb

import pytest

from warpdecode.errors import ConfigError
from warpdecode.metrics.pass_at_k import mean_pass_at_k, pass_at_k


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 1, 2 / 5),             # pass@1 is the share of passing samples
    (5, 2, 2, 1 - 3 / 10),        # C(3,2)=3, C(5,2)=10
    (10, 3, 5, 1 - 21 / 252),     # C(7,5)=21, C(10,5)=252
    (4, 0, 2, 0.0),
    (4, 4, 3, 1.0),
    (5, 4, 2, 1.0),               # n - c < k: every draw of 2 holds a passing sample
    (1, 1, 1, 1.0),
    (200, 13, 100, 1 - comb(187, 100) / comb(200, 100)),
])
def test_pass_at_k_equals_the_binomial_ratio(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_mean_pass_at_k_averages_over_problems():
    assert mean_pass_at_k([5, 5, 1], [2, 0, 1], 1) == pytest.approx((2 / 5 + 0 + 1) / 3)


@pytest.mark.parametrize("n, c, k", [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)])
def test_impossible_counts_are_refused(n, c, k):
    with pytest.raises(ConfigError, match="pass@k"):
        pass_at_k(n, c, k)
