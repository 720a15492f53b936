"""FiRST layer routers: prompt means, gates, skip decisions, and the gated forward they train through."""

from __future__ import annotations

import pytest
import torch
from tiny_models import greedy_target

from warpdecode.decoding.drafters.draft_model import layer_subset
from warpdecode.errors import ConfigError
from warpdecode.models.layer_router import LayerRouter, prompt_means, skipped_layers


def test_prompt_means_average_the_masked_positions_and_normalise():
    hidden = torch.randn(2, 3, 5, 8)  # (B, L, T, C)
    mask = torch.tensor([[True, True, False, False, False], [True] * 5])
    means = prompt_means(hidden, mask)
    expected = hidden[0, :, :2].mean(1)
    expected = expected / expected.pow(2).mean(-1, keepdim=True).sqrt()
    torch.testing.assert_close(means[0], expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(means[1], prompt_means(hidden[1:])[0])
    torch.testing.assert_close(means.pow(2).mean(-1), torch.ones(2, 3), rtol=1e-4, atol=1e-4)


def test_the_first_and_last_block_always_run():
    router = LayerRouter(5, 8, init_bias=-10.0)
    gates = router(torch.randn(3, 5, 8))
    assert gates[:, 0].eq(1).all() and gates[:, -1].eq(1).all() and gates[:, 1:-1].lt(1e-3).all()
    assert skipped_layers(gates[0], 0.5) == [1, 2, 3]
    with pytest.raises(ConfigError, match="reads"):
        router(torch.randn(3, 4, 8))
    with pytest.raises(ConfigError, match="n_layer >= 3"):
        LayerRouter(2, 8)


def test_skipped_layers_takes_the_lowest_gates_first():
    gates = torch.tensor([1.0, 0.2, 0.9, 0.4, 1.0])
    assert skipped_layers(gates, 0.5) == [1, 3]
    assert skipped_layers(gates, 0.5, max_skip=1) == [1]
    assert skipped_layers(gates, 0.95) == [1, 2, 3]
    assert skipped_layers(gates, 0.1) == []


def test_gated_forward_interpolates_between_running_and_skipping_a_block():
    model = greedy_target()
    tokens = torch.tensor([[3, 7, 1, 9, 4]])
    with torch.no_grad():
        plain = model(tokens).logits
        ones = model(tokens, layer_gates=torch.ones(1, 3)).logits
        skip_middle = model(tokens, layer_gates=torch.tensor([[1.0, 0.0, 1.0]])).logits
        subset = layer_subset(model, [0, 2])(tokens).logits
    torch.testing.assert_close(ones, plain)
    torch.testing.assert_close(skip_middle, subset)
    with pytest.raises(ValueError, match="layer_gates"):
        model(tokens, layer_gates=torch.ones(1, 2))
