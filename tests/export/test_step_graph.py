"""StepGraph (the exported form of one decode step) against `Transformer.forward`, its reference, in PyTorch."""

import pytest
import torch
from tiny_models import greedy_target, random_model

from warpdecode.errors import ConfigError
from warpdecode.export.step_graph import StepGraph
from warpdecode.models.cache import KVCache

pytestmark = pytest.mark.usefixtures("single_thread")

GPT2_LIKE = {"vocab_size": 50, "n_layer": 2, "n_head": 2, "d_model": 16, "d_ff": 32, "max_seq_len": 64, "norm": "layernorm",
             "mlp": "gelu_tanh", "position": "learned", "qkv_bias": True, "out_bias": True, "mlp_bias": True,
             "tie_embeddings": False}


def step_inputs(cache: KVCache, tokens, tree_mask, T):
    """StepGraph's inputs for a forward of `tokens` (B, T) after the rows' cached positions."""
    B = tokens.shape[0]
    S = cache.max_len
    past = torch.arange(S)[None, None, :] < cache.lengths[:, None, None]
    mask = torch.cat((past.expand(B, T, S), tree_mask.expand(B, T, T)), dim=-1)[:, None]
    positions = cache.lengths[:, None] + torch.arange(T)
    return positions, mask


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_step_graph_equals_forward_with_cache_and_tree(family):
    model = greedy_target() if family == "llama" else random_model(seed=2, std=0.3, **GPT2_LIKE)
    graph = StepGraph(model, (0, model.config.n_layer)).eval()
    L = model.config.n_layer
    cache = KVCache.for_model(model.config, 2, 24)
    with torch.inference_mode():
        model(torch.randint(0, 40, (2, 7)), cache=cache)
        cache.truncate([7, 4])  # rows of different lengths
        tokens = torch.randint(0, 40, (2, 4))
        tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)[None]
        positions, mask = step_inputs(cache, tokens, tree, 4)
        past = [buffer[i] for i in range(L) for buffer in (cache.k, cache.v)]
        logits, new_k, new_v, h0, hL = graph(tokens, positions, mask, torch.arange(4), *past)
        start = cache.lengths.clone()
        ref = model(tokens, positions, cache, tree, hidden_layers=(0, L))
    torch.testing.assert_close(logits, ref.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hL, ref.hidden_states[L])
    torch.testing.assert_close(h0, ref.hidden_states[0])
    for row in range(2):
        s = int(start[row])
        torch.testing.assert_close(new_k[:, row], cache.k[:, row, :, s:s + 4], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(new_v[:, row], cache.v[:, row, :, s:s + 4], atol=1e-5, rtol=1e-4)


def test_step_graph_selects_logit_positions():
    model = greedy_target()
    graph = StepGraph(model, ()).eval()
    cache = KVCache.for_model(model.config, 1, 8)
    tokens = torch.tensor([[3, 4, 5]])
    positions, mask = step_inputs(cache, tokens, torch.ones(1, 3, 3, dtype=torch.bool).tril(), 3)
    past = [buffer[i] for i in range(model.config.n_layer) for buffer in (cache.k, cache.v)]
    with torch.inference_mode():
        last = graph(tokens, positions, mask, torch.tensor([2]), *past)[0]
        full = model(tokens).logits
    torch.testing.assert_close(last[0, 0], full[0, 2], atol=1e-5, rtol=1e-5)


def test_step_graph_refuses_unknown_hidden_layer():
    with pytest.raises(ConfigError, match="out of range"):
        StepGraph(greedy_target(), (4,))
