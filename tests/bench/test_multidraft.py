"""The multi-draft diagnostic: exact acceptance formulas and the optimal rate."""

import pytest
import torch

from warpdecode.bench.multidraft import compare, optimal_acceptance, specinfer_acceptance, spectr_acceptance
from warpdecode.decoding.tree import DraftTree
from warpdecode.decoding.verifiers.speculative_sampling import speculative_accept


def test_identical_distributions_are_always_accepted():
    p = torch.softmax(torch.randn(6), -1)
    for k in (1, 3):
        assert optimal_acceptance(p, p, k) == pytest.approx(1.0)
        assert specinfer_acceptance(p, p, k) == pytest.approx(1.0)


def test_single_draft_optimum_is_one_minus_total_variation():
    gen = torch.Generator().manual_seed(1)
    p, q = (torch.softmax(torch.randn(7, generator=gen), -1) for _ in range(2))
    assert optimal_acceptance(p, q, 1) == pytest.approx(float(torch.minimum(p, q).sum()), abs=1e-6)
    assert spectr_acceptance(p, q, 1) == pytest.approx(specinfer_acceptance(p, q, 1), abs=1e-6)


def test_exact_specinfer_rate_matches_simulation():
    gen = torch.Generator().manual_seed(2)
    p, q = (torch.softmax(torch.randn(6, generator=gen) * 1.5, -1) for _ in range(2))
    k, n, accepted = 3, 20000, 0
    for _ in range(n):
        xs = torch.multinomial(q, k, replacement=True, generator=gen)
        tree = DraftTree(xs, torch.full((k,), -1), q.expand(k, -1))
        accepted += len(speculative_accept(tree, p.expand(k + 1, -1), torch.rand(k, generator=gen), gen).path)
    assert accepted / n == pytest.approx(specinfer_acceptance(p, q, k), abs=0.015)


def test_schemes_sit_between_one_draft_and_the_optimum():
    for row in compare(vocab=6, drafts=[2, 4], pairs=30, scale=1.5, seed=0):
        assert row["single draft"] <= row["specinfer"] <= row["optimal"] + 1e-9
        assert row["single draft"] <= row["spectr"] <= row["optimal"] + 1e-9


def test_large_vocabularies_are_refused():
    with pytest.raises(ValueError, match="2\\^V"):
        optimal_acceptance(torch.ones(17) / 17, torch.ones(17) / 17, 2)
