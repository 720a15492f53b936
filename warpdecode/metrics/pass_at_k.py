"""pass@k, the unbiased estimator of Chen et al. 2021 (Evaluating Large Language Models Trained on Code, eq. 1).

With n samples of a problem of which c pass, the probability that at least one of k samples drawn
without replacement passes is 1 − C(n−c, k) / C(n, k); pass@k of a set is its mean over problems.
The product form below avoids the large binomials (the paper's numpy version):
C(n−c, k) / C(n, k) = Π_{i=n−c+1}^{n} (1 − k / i).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from warpdecode.errors import ConfigError


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of k of the n samples passes, when c of them do."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ConfigError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(samples: Sequence[int], correct: Sequence[int], k: int) -> float:
    """pass@k of a set: the mean over problems (samples[i] drawn, correct[i] passing) of `pass_at_k`."""
    if len(samples) != len(correct) or not samples:
        raise ConfigError(f"pass@k needs as many sample counts as pass counts (and some), got {len(samples)} and {len(correct)}")
    return sum(pass_at_k(n, c, k) for n, c in zip(samples, correct, strict=True)) / len(samples)
