"""Draft-budget controllers: the fixed budget, the acceptance-driven adaptive length and the cost-aware cut."""

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


def repetitive_model():
    """A tiny random model and a prompt that repeats itself (prompt lookup drafts from it)."""
    from warpdecode.models.config import ModelConfig
    from warpdecode.models.transformer import Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=32, n_layer=2, n_head=2, d_model=16, d_ff=32, max_seq_len=128))
    model.init_weights(std=0.5)
    return model.eval(), [3, 4, 5, 6] * 6


def test_adaptive_prompt_lookup_stays_lossless(single_thread):
    model, prompt = repetitive_model()
    plain = generate(model, None, prompt, max_new_tokens=30, stop_at_eos=False)
    adaptive = generate(model, None, prompt, max_new_tokens=30, stop_at_eos=False,
                        method=build_method("prompt_lookup", controller="adaptive"))
    assert adaptive.token_ids == plain.token_ids
    assert max(adaptive.stats.proposed_per_step) <= 32


def test_level_cost_fits_a_line_through_the_step_times():
    from warpdecode.decoding.draft_cost import LevelCost

    fit = LevelCost(memory=1000)
    fit.observe(1, 0.010)
    assert fit.cost() is None  # one width: no slope yet
    for width in (1, 3, 5, 1, 8):
        fit.observe(width, 0.010 + 0.002 * (width - 1))
    first, per_position = fit.cost()
    assert first == pytest.approx(0.010) and per_position == pytest.approx(0.002)


def test_keep_depth_verifies_the_levels_that_pay():
    from warpdecode.decoding.draft_cost import keep_depth
    from warpdecode.decoding.tree import DraftTree

    chain = DraftTree.chain([5, 6, 7, 8])
    shares = {1: 0.9, 2: 0.5, 3: 0.1, 4: 0.1}
    # a position costs 20 % of a step: level 1 (0.9) and 2 (0.5 > 0.2 * 1.9 / 1.2) pay, level 3 (0.1) does not
    assert keep_depth(chain, (0.010, 0.002), shares.__getitem__) == 2
    assert keep_depth(chain, (0.010, 0.0), shares.__getitem__) == 4  # free positions: verify everything
    assert keep_depth(chain, (0.010, 0.02), shares.__getitem__) == 0  # dear positions: verify nothing


def test_cost_controller_cuts_weak_drafts_and_still_explores():
    from warpdecode.decoding.controllers.cost import CostAware
    from warpdecode.decoding.tree import DraftTree

    control = CostAware(explore_every=4)
    chain = DraftTree.chain([1, 2, 3])
    assert control.trim(None, chain).size == 3  # nothing measured: verify it all
    control.observe(step(0, 3))
    for width in (1, 4) * 10:  # a position costs half a step
        control.costs.observe(width, 0.010 + 0.005 * (width - 1))
    for _ in range(50):  # and these chains are never accepted
        control.acceptance.learn("", 3, 3, 0)
    sizes = []
    for _ in range(8):
        sizes.append(control.trim(None, chain).size)
        control.observe(step(0, sizes[-1]))
    assert sizes == [0, 0, 0, 1, 0, 0, 0, 1]  # cut to nothing, one level every 4th time
    with pytest.raises(ConfigError, match="explore_every >= 1"):
        CostAware(explore_every=0)


def test_cost_controller_prompt_lookup_stays_lossless(single_thread):
    model, prompt = repetitive_model()
    plain = generate(model, None, prompt, max_new_tokens=40, stop_at_eos=False)
    method = build_method("prompt_lookup", controller="cost")
    for _ in range(2):  # the second request starts with the first one's measurements
        cut = generate(model, None, prompt, max_new_tokens=40, stop_at_eos=False, method=method)
        assert cut.token_ids == plain.token_ids
