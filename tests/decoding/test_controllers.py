"""Draft-budget controllers: the fixed budget and the acceptance-driven adaptive length."""

import pytest
import torch

from warpdecode.decoding.controllers.adaptive import AdaptiveLength
from warpdecode.decoding.generate import build_method, generate
from warpdecode.decoding.protocols import AcceptResult
from warpdecode.errors import ConfigError


def step(accepted: int, proposed: int) -> AcceptResult:
    return AcceptResult(list(range(accepted)), [0] * (accepted + 1), proposed)


def test_adaptive_grows_on_full_acceptance_and_shrinks_on_rejection():
    control = AdaptiveLength(initial=4, grow=2, shrink=1, min_nodes=2, max_nodes=7)
    budgets = []
    for accepted, proposed in [(4, 4), (6, 6), (7, 7), (0, 7), (3, 6), (0, 0), (1, 5), (0, 4), (0, 3)]:
        control.observe(step(accepted, proposed))
        budgets.append(control.budget(None))
    # full acceptance +2 (capped at 7), rejection -1 (floored at 2), no proposal: unchanged
    assert budgets == [6, 7, 7, 6, 5, 5, 4, 3, 2]


def test_adaptive_restarts_every_request():
    control = AdaptiveLength(initial=3)
    control.observe(step(3, 3))
    control.start(None)
    assert control.budget(None) == 3


def test_adaptive_rejects_inconsistent_bounds():
    with pytest.raises(ConfigError, match="min_nodes <= initial <= max_nodes"):
        AdaptiveLength(initial=10, max_nodes=4)


def test_adaptive_prompt_lookup_stays_lossless(single_thread):
    from warpdecode.models.config import ModelConfig
    from warpdecode.models.transformer import Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=32, n_layer=2, n_head=2, d_model=16, d_ff=32, max_seq_len=128))
    model.init_weights(std=0.5)
    prompt = [3, 4, 5, 6] * 6
    plain = generate(model.eval(), None, prompt, max_new_tokens=30, stop_at_eos=False)
    adaptive = generate(model, None, prompt, max_new_tokens=30, stop_at_eos=False,
                        method=build_method("prompt_lookup", controller="adaptive"))
    assert adaptive.token_ids == plain.token_ids
    assert max(adaptive.stats.proposed_per_step) <= 32
