"""SpecTr's k-sequential selection: lossless on i.i.d. drafts, at the predicted acceptance rate.

The end-to-end distribution test through the engine is in test_exactness.py (draft_model-tree-spectr)."""

import torch
from tiny_models import tv

from warpdecode.decoding.tree import DraftTree
from warpdecode.decoding.verifiers import spectr as spectr_module
from warpdecode.decoding.verifiers.spectr import (
    accepted_mass,
    kseq_residual,
    smallest_valid_rho,
    spectr_accept,
)


def sample_first_tokens(p, q, k, n, gen, accept=spectr_accept):
    first, accepted = [], 0
    for _ in range(n):
        xs = torch.multinomial(q, k, replacement=True, generator=gen)
        out = accept(DraftTree(xs, torch.full((k,), -1), q.expand(k, -1)), p, torch.rand(k, generator=gen), gen)
        first.append(out.tokens[0])
        accepted += len(out.path)
    return first, accepted / n


def test_rho_makes_the_residual_a_distribution():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        p, q = (torch.softmax(torch.randn(8, generator=gen) * 2, -1) for _ in range(2))
        for k in (1, 2, 4):
            rho = smallest_valid_rho(p, q, k)
            kept, factor = accepted_mass(p, q, rho, k)
            assert 1.0 <= rho <= k and bool((p - kept * factor >= -1e-6).all())
            assert torch.isclose(kseq_residual(p, q, rho, k).sum(), torch.tensor(1.0))
    assert smallest_valid_rho(p, q, 1) == 1.0  # one draft: plain speculative sampling


def test_kseq_follows_the_target_and_accepts_at_the_predicted_rate():
    gen = torch.Generator().manual_seed(0)
    V, k = 8, 3
    p = torch.softmax(torch.randn(k + 1, V, generator=gen) * 1.5, -1)  # rows: after pending, after each draft
    q = torch.softmax(torch.randn(V, generator=gen) * 1.5, -1)
    first, rate = sample_first_tokens(p, q, k, 10000, gen)
    assert tv(first, p[0]) < 0.03
    kept, _ = accepted_mass(p[0], q, smallest_valid_rho(p[0], q, k), k)
    assert abs(rate - (1 - (1 - float(kept.sum())) ** k)) < 0.02


def test_wrong_residual_fails_the_distribution_test(monkeypatch):
    """Power check: resampling from p after k rejections (instead of p_res) is detected. The wrong rule
    moves the first token's TV to ~0.14; 3000 draws measure it to about +-0.015."""
    monkeypatch.setattr(spectr_module, "kseq_residual", lambda p, q, rho, k: p)
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, 8, generator=gen) * 1.5, -1)
    q = torch.softmax(torch.randn(8, generator=gen) * 1.5, -1)
    first, _ = sample_first_tokens(p, q, 3, 3000, gen)
    assert tv(first, p[0]) > 0.03
