"""Greedy acceptance over a static tree on the device against the host verifier's walk."""

from __future__ import annotations

import random

import pytest
import torch

from warpdecode.decoding.tree import DraftTree
from warpdecode.decoding.verifiers.greedy_match import greedy_accept
from warpdecode.kernels.tree_accept import TreeTables, greedy_tree_accept

EXAMPLE = [-1, -1, 0, 1, 3]  # decoding/tree.py's worked example


def test_tables_of_the_worked_example() -> None:
    t = TreeTables.from_parents(EXAMPLE)
    assert t.parent_rows.tolist() == [0, 0, 1, 2, 4]
    assert t.depths.tolist() == [1, 1, 2, 2, 3]
    assert t.preorder.tolist() == [0, 2, 1, 3, 4]
    assert t.ancestors[4].tolist() == [False, True, False, True, True]
    assert t.max_depth == 3 and not t.is_chain
    _, positions, mask = DraftTree(torch.zeros(5, dtype=torch.int64), torch.tensor(EXAMPLE)).verify_inputs(0, 0)
    assert torch.equal(t.mask, mask) and t.row_depths.tolist() == positions[0].tolist()
    assert TreeTables.from_parents([-1, 0, 1]).is_chain


def test_worked_example_path() -> None:
    t = TreeTables.from_parents(EXAMPLE)
    best = torch.tensor([7, 1, 9, 3, 5, 2])  # after pending: 7; after node 1 (row 2): 9; after node 3 (row 4): 5
    tokens = torch.tensor([0, 6, 7, 4, 9, 8])  # pending, then nodes 0..4: node 1 = 7 and node 3 = 9 correct, node 4 = 8 not
    accepted, rows, emitted = greedy_tree_accept(tokens, best, torch.ones(5, dtype=torch.bool), t)
    assert int(accepted) == 2 and rows.tolist() == [0, 2, 4, 0] and emitted[:3].tolist() == [7, 9, 5]


def random_tree(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(-1, i) if rng.random() < 0.7 else (i - 1) for i in range(n)]


def naive(parents: list[int], tokens: list[int], best: torch.Tensor, valid: list[bool]) -> tuple[list[int], list[int]]:
    """greedy_accept on the tree of the valid nodes only (what a host drafter would have proposed)."""
    keep = [i for i in range(len(parents)) if valid[i]]
    new = {old: j for j, old in enumerate(keep)}
    tree = DraftTree(torch.tensor([tokens[i] for i in keep], dtype=torch.int64),
                     torch.tensor([new[parents[i]] if parents[i] >= 0 else -1 for i in keep], dtype=torch.int64))
    logits = torch.nn.functional.one_hot(best[[0] + [i + 1 for i in keep]], 6).float()
    result = greedy_accept(tree, logits)
    return [keep[j] + 1 for j in result.path], result.tokens


@pytest.mark.parametrize("seed", range(40))
def test_matches_the_host_walk_on_random_trees(seed: int) -> None:
    """Random shapes, duplicate sibling tokens (the first matching child wins) and nodes left unfilled
    (their descendants are unfilled too, as a drafter leaves them)."""
    rng = random.Random(seed)
    n = rng.randrange(1, 14)
    parents = random_tree(rng, n)
    t = TreeTables.from_parents(parents)
    g = torch.Generator().manual_seed(seed)
    for _ in range(20):
        best = torch.randint(0, 6, (n + 1,), generator=g)
        tokens = [int(best[p + 1]) if rng.random() < 0.6 else rng.randrange(6) for p in parents]
        valid: list[bool] = []
        for p in parents:
            valid.append(rng.random() < 0.85 and (p < 0 or valid[p]))
        accepted, rows, emitted = greedy_tree_accept(torch.tensor([0] + tokens), best, torch.tensor(valid), t)
        want_rows, want_tokens = naive(parents, tokens, best, valid)
        a = int(accepted)
        assert a == len(want_rows)
        assert rows[1 : a + 1].tolist() == want_rows and emitted[: a + 1].tolist() == want_tokens


def test_plain_decoding_has_no_nodes() -> None:
    t = TreeTables.from_parents([])
    accepted, rows, emitted = greedy_tree_accept(torch.tensor([3]), torch.tensor([5]), torch.zeros(0, dtype=torch.bool), t)
    assert int(accepted) == 0 and rows.tolist() == [0] and emitted.tolist() == [5]


def test_refuses_unordered_parents_and_unknown_impl() -> None:
    with pytest.raises(ValueError, match="topological"):
        TreeTables.from_parents([1, -1])
    t = TreeTables.from_parents([-1])
    with pytest.raises(ValueError, match="impl"):
        greedy_tree_accept(torch.tensor([0, 1]), torch.tensor([1, 1]), torch.tensor([True]), t, impl="cuda")  # type: ignore[arg-type]
