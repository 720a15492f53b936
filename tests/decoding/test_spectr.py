"""SpecTr's k-sequential selection: lossless on i.i.d. drafts, more accepting than SpecInfer's rule."""

import torch

from warpdecode.decoding import registry
from warpdecode.decoding.generate import build_method, generate
from warpdecode.decoding.tree import DraftTree
from warpdecode.decoding.verifiers import spectr as spectr_module
from warpdecode.decoding.verifiers.spectr import (
    accepted_mass,
    kseq_residual,
    smallest_valid_rho,
    spectr_accept,
)
from warpdecode.models.config import ModelConfig
from warpdecode.models.transformer import Transformer


def tv(samples, probs):
    freq = torch.bincount(torch.tensor(samples), minlength=probs.numel()).double() / len(samples)
    return 0.5 * (freq - probs.double()).abs().sum().item()


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
    """Power check: resampling from p after k rejections (instead of p_res) is detected."""
    monkeypatch.setattr(spectr_module, "kseq_residual", lambda p, q, rho, k: p)
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, 8, generator=gen) * 1.5, -1)
    q = torch.softmax(torch.randn(8, generator=gen) * 1.5, -1)
    first, _ = sample_first_tokens(p, q, 3, 10000, gen)
    assert tv(first, p[0]) > 0.03


def test_engine_with_spectr_is_lossless_in_distribution(single_thread):
    """End to end: draft_model top-2 trees verified by SpecTr; the 2nd token follows the target given the 1st."""
    config = ModelConfig(vocab_size=8, n_layer=2, n_head=2, d_model=16, d_ff=32, max_seq_len=32)
    torch.manual_seed(3)
    model = Transformer(config)
    model.init_weights(std=0.8)
    model.eval()
    assert registry.get("verifier", "spectr").lossless
    method = build_method("draft_model", do_sample=True, verifier="spectr", options={"layers": 1, "num_tokens": 2, "top_k": 2})
    pairs = [generate(model, None, [1, 2, 1, 2, 1], max_new_tokens=4, do_sample=True, seed=s, stop_at_eos=False,
                      method=method).token_ids[:2] for s in range(3000)]
    firsts = [a for a, _ in pairs]
    common = max(set(firsts), key=firsts.count)
    seconds = [b for a, b in pairs if a == common]
    with torch.inference_mode():
        expected = torch.softmax(model(torch.tensor([[1, 2, 1, 2, 1, common]])).logits[0, -1], -1)
    assert len(seconds) > 500 and tv(seconds, expected) < 0.08
