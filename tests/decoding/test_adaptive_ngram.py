"""Adaptive n-gram drafting: the tri-gram table, the best-first tree, losslessness."""

import pytest
import torch

from warpdecode.decoding.drafters.adaptive_ngram import AdaptiveNgramDrafter
from warpdecode.decoding.generate import build_method, generate
from warpdecode.decoding.protocols import DecodeState
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import ConfigError
from warpdecode.models.config import ModelConfig
from warpdecode.models.transformer import Transformer


def state(tokens, forward_tokens=None, logits=None, tree=None):
    return DecodeState(None, None, tokens, 1, Sampler(SamplingConfig()), {},
                       None if forward_tokens is None else torch.tensor(forward_tokens), logits, tree)


def test_tree_grows_best_first_from_the_trigram_table_with_unigram_backoff():
    drafter = AdaptiveNgramDrafter(top_k=2, num_nodes=4)
    drafter.trigrams[(1, 2)] = ([5, 6], [0.6, 0.3])  # after "1 2": 5 (0.6), 6 (0.3)
    drafter.unigrams[5] = ([7, 8], [0.9, 0.1])  # after 5 (no tri-gram for "2 5"): 7 (0.9)
    drafter.unigrams[6] = ([9, 5], [0.5, 0.5])
    tree = drafter.propose(state([1, 2]), budget=10)
    # path probabilities: 5: .6, 5→7: .54, 6: .3, 6→9 and 6→5: .15, 5→8: .06
    assert tree.tokens.tolist() == [5, 7, 6, 9]
    assert tree.parents.tolist() == [-1, 0, -1, 2]
    verified = state([1, 2], forward_tokens=[2] + tree.tokens.tolist(), logits=torch.zeros(5, 10), tree=tree)
    assert drafter.contexts(verified) == [1, 2, 5, 2, 6]  # the token before each forward input: pending, then nodes
    assert drafter.propose(state([1, 2]), budget=2).tokens.tolist() == [5, 7]


def test_mcts_visits_the_likely_paths_and_explores_the_others():
    drafter = AdaptiveNgramDrafter(top_k=2, num_nodes=4, search="mcts", simulations=40, exploration=0.5)
    drafter.trigrams[(1, 2)] = ([5, 6], [0.6, 0.3])
    drafter.unigrams[5] = ([7, 8], [0.9, 0.1])
    drafter.unigrams[6] = ([9, 5], [0.5, 0.5])
    tree = drafter.propose(state([1, 2]), budget=10)
    paths = tree.path_tokens()
    assert paths[0] == (5,) and (5, 7) in paths  # the most probable line gets the most rollouts
    assert (6,) in paths  # exploration also tries the second candidate
    assert all(p < i for i, p in enumerate(tree.parents.tolist()))  # parents first
    greedy = AdaptiveNgramDrafter(top_k=2, num_nodes=4, search="mcts", simulations=40, exploration=0.0)
    greedy.trigrams, greedy.unigrams = drafter.trigrams, drafter.unigrams
    assert greedy.propose(state([1, 2]), budget=10).tokens.tolist() == [5, 7]  # no exploration: one line


def test_record_stores_each_forward_row_under_its_context():
    drafter = AdaptiveNgramDrafter(top_k=1)
    drafter.prev = 4
    logits = torch.full((2, 10), -9.0)
    logits[0, 3] = logits[1, 8] = 5.0
    drafter.record(state([4, 2], forward_tokens=[2, 3], logits=logits, tree=DraftTree.chain([3])))
    assert drafter.trigrams[(4, 2)][0] == [3] and drafter.trigrams[(2, 3)][0] == [8]
    assert drafter.unigrams[3][0] == [8]


def test_table_is_bounded():
    drafter = AdaptiveNgramDrafter(top_k=1, max_entries=2)
    for i in range(4):
        drafter.prev = i
        drafter.record(state([0], forward_tokens=[i + 10], logits=torch.randn(1, 20)))
    assert list(drafter.trigrams) == [(2, 12), (3, 13)]


@pytest.mark.parametrize("search", ["best_first", "mcts"])
def test_lossless_and_learns_across_requests(search, single_thread):
    config = ModelConfig(vocab_size=16, n_layer=1, n_head=2, d_model=16, d_ff=32, max_seq_len=128)
    torch.manual_seed(0)
    model = Transformer(config)
    model.init_weights(std=0.5)
    model.eval()
    method = build_method("adaptive_ngram", options={"search": search})
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    plain = generate(model, None, prompt, max_new_tokens=40, stop_at_eos=False)
    first = generate(model, None, prompt, max_new_tokens=40, stop_at_eos=False, method=method)
    second = generate(model, None, prompt, max_new_tokens=40, stop_at_eos=False, method=method)
    assert first.token_ids == second.token_ids == plain.token_ids
    assert second.stats.tau >= first.stats.tau > 1.0
    if search == "best_first":
        assert second.stats.tau > first.stats.tau  # the table filled by the first request pays off


def test_bad_options():
    with pytest.raises(ConfigError, match="positive options"):
        AdaptiveNgramDrafter(num_nodes=0)
    with pytest.raises(ConfigError, match="best_first or mcts"):
        AdaptiveNgramDrafter(search="beam")
