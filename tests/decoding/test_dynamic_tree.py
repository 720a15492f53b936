"""DySpec dynamic trees: best-first growth under node and expansion budgets, and losslessness."""

import pytest
import torch
from tiny_models import greedy_target

from warpdecode.decoding.drafters.dynamic_tree import grow_dynamic_tree
from warpdecode.decoding.generate import build_method, generate
from warpdecode.errors import ConfigError


def logits_of(probs: dict[int, float], vocab: int = 8) -> torch.Tensor:
    """(V,) logits whose softmax puts `probs` on the given tokens and spreads the rest evenly."""
    rest = (1 - sum(probs.values())) / (vocab - len(probs))
    return torch.tensor([probs.get(t, rest) for t in range(vocab)]).log()


# The docstring's example: the draft's next-token distribution after each path.
DRAFT = {(): {1: 0.6, 2: 0.3}, (1,): {3: 0.8, 4: 0.1}, (1, 3): {5: 0.9, 6: 0.05}}


def test_grows_where_the_path_probability_is_highest():
    calls = []

    def expand(path):
        calls.append(tuple(path))
        return logits_of(DRAFT.get(tuple(path), {7: 0.5}))

    tree = grow_dynamic_tree(logits_of(DRAFT[()]), expand, num_nodes=4, max_expansions=2, width=2)
    assert tree.tokens.tolist() == [1, 3, 5, 2]
    assert tree.parents.tolist() == [-1, 0, 1, -1]
    assert calls == [(1,), (1, 3)]  # nodes are expanded in the order they join, until the budget ends


def test_budgets_and_depth_limit():
    expand_calls = []

    def expand(path):
        expand_calls.append(path)
        return logits_of({0: 0.9})

    tree = grow_dynamic_tree(logits_of({0: 0.9}), expand, num_nodes=6, max_expansions=10, width=2, max_depth=3)
    assert tree.size == 6 and int(tree.depths().max()) <= 3
    assert all(len(path) < 3 for path in expand_calls)
    chain = grow_dynamic_tree(logits_of({0: 0.9}), expand, num_nodes=3, max_expansions=0, width=3)
    assert chain.parents.tolist() == [-1, -1, -1]  # no expansion: the root's top candidates only


@pytest.mark.parametrize("options", [{"num_nodes": 6, "num_tokens": 3, "top_k": 2}, {"num_nodes": 1}])
def test_dynamic_tree_draft_model_is_token_identical_to_greedy(options, single_thread):
    target = greedy_target()
    prompt = [3, 9, 27, 17, 51, 25]
    plain = generate(target, None, prompt, max_new_tokens=30, stop_at_eos=False)
    method = build_method("draft_model", options={"layers": 2} | options)
    out = generate(target, None, prompt, max_new_tokens=30, stop_at_eos=False, method=method)
    assert out.token_ids == plain.token_ids
    assert max(out.stats.proposed_per_step) >= 1


def test_dynamic_tree_refuses_sampling(single_thread):
    method = build_method("draft_model", do_sample=True, options={"layers": 2, "num_nodes": 4})
    with pytest.raises(ConfigError, match="greedily only"):
        generate(greedy_target(), None, [1, 2, 3], max_new_tokens=4, do_sample=True, method=method)
