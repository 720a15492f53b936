"""Token Recycling: the adjacency matrix, the tree it fills, and losslessness."""

import pytest
import torch

from warpdecode.decoding.drafters.token_recycling import TokenRecyclingDrafter
from warpdecode.decoding.generate import build_method, generate
from warpdecode.decoding.protocols import DecodeState
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.tree_shapes import best_rank_paths
from warpdecode.errors import ConfigError
from warpdecode.models.config import ModelConfig
from warpdecode.models.transformer import Transformer


@pytest.fixture(scope="module")
def target():
    config = ModelConfig(vocab_size=16, n_layer=1, n_head=2, d_model=16, d_ff=32, max_seq_len=128)
    torch.manual_seed(0)
    model = Transformer(config)
    model.init_weights(std=0.5)
    return model.eval()


def test_best_rank_paths_orders_by_probability_and_keeps_parents_first():
    assert best_rank_paths(4, (0.5, 0.2)) == [(0,), (0, 0), (1,), (0, 0, 0)]
    paths = best_rank_paths(40)
    assert len(paths) == len(set(paths)) == 40
    assert all(p[:-1] in paths[:i] for i, p in enumerate(paths) if len(p) > 1)
    assert max(len(p) for p in best_rank_paths(40, max_depth=3)) == 3


def state_after(target, tokens, logits):
    """A decode state whose last forward ran `tokens` and produced `logits` (T, V)."""
    return DecodeState(target, None, [3], 1, Sampler(SamplingConfig()), {}, torch.tensor(tokens), logits)


def test_recycled_candidates_fill_the_tree_shape(target):
    drafter = TokenRecyclingDrafter(top_k=2, num_nodes=5)
    drafter.shape = [(0,), (1,), (0, 0), (0, 1), (1, 0)]
    drafter.prepare(target)
    logits = torch.full((2, 16), -5.0)
    logits[0, [7, 9]] = torch.tensor([2.0, 1.0])  # after token 3: 7, then 9
    logits[1, [4, 5]] = torch.tensor([2.0, 1.0])  # after token 7: 4, then 5
    drafter.start(state_after(target, [3, 7], logits))
    tree = drafter.propose(state_after(target, [3], logits[:1]), budget=10)
    # 9 has never been an input token: no row, so the shape's node (1, 0) is skipped
    assert tree.tokens.tolist() == [7, 9, 4, 5]
    assert tree.parents.tolist() == [-1, -1, 0, 0]
    assert drafter.propose(state_after(target, [3], logits[:1]), budget=3).size == 3


def test_unknown_pending_token_drafts_nothing(target):
    drafter = TokenRecyclingDrafter()
    drafter.prepare(target)
    assert drafter.propose(state_after(target, [3], torch.zeros(1, 16)), budget=8).size == 0


def test_matrix_persists_across_requests_and_stays_lossless(target, single_thread):
    method = build_method("token_recycling", options={"num_nodes": 12})
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    plain = generate(target, None, prompt, max_new_tokens=40, stop_at_eos=False)
    first = generate(target, None, prompt, max_new_tokens=40, stop_at_eos=False, method=method)
    second = generate(target, None, prompt, max_new_tokens=40, stop_at_eos=False, method=method)
    assert first.token_ids == second.token_ids == plain.token_ids
    assert second.stats.tau > first.stats.tau > 1.0  # the warm matrix drafts from the first step on


def test_bad_options_are_config_errors():
    with pytest.raises(ConfigError, match="top_k, num_nodes, max_depth >= 1"):
        TokenRecyclingDrafter(num_nodes=0)
