"""Simulated acceptance from rank matrices, and the tree built from them."""

import torch

from warpdecode.decoding.tree_shapes import chain
from warpdecode.metrics.drafting import (
    DraftRanks,
    accepted_depths,
    label_ranks,
    simulated_tau,
    tree_from_ranks,
)

R = 8  # max_rank: "not a candidate"


def test_label_ranks_counts_strictly_better_candidates():
    logits = torch.tensor([[0.1, 0.9, 0.5], [0.3, 0.2, 0.1], [1.0, 0.0, 0.0]])
    labels = torch.tensor([2, 0, -1])
    assert label_ranks(logits, labels, R).tolist() == [1, 0, R]
    assert label_ranks(logits, torch.tensor([0, 2, 1]), max_rank=1).tolist() == [1, 1, 1]


def test_accepted_depth_of_a_tree():
    ranks = torch.tensor([[0, 0, 0], [0, 1, 0], [1, 0, 3], [2, 0, 0], [0, R, 0]])
    tree = [(0,), (1,), (0, 0), (0, 1), (0, 0, 0), (1, 0)]
    assert accepted_depths(ranks, tree).tolist() == [3, 2, 2, 0, 1]
    assert simulated_tau(ranks, tree) == 1 + 8 / 5
    assert simulated_tau(ranks, chain(3)) == 1 + (3 + 1 + 0 + 0 + 1) / 5


def test_tree_from_ranks_takes_the_most_frequent_prefixes():
    ranks = torch.tensor([[0, 0], [0, 0], [0, 1], [1, 0], [0, 0], [2, R]])
    # prefix counts: (0,) 4, (0,0) 3, (1,) 1, (0,1) 1, (1,0) 1, (2,) 1
    assert tree_from_ranks(ranks, 3, R) == [(0,), (0, 0), (1,)]  # ties: the shorter path first
    tree = tree_from_ranks(ranks, 6, R)
    assert tree == [(0,), (0, 0), (1,), (2,), (0, 1), (1, 0)]
    assert all(len(p) == 1 or p[:-1] in tree[: tree.index(p)] for p in tree)  # parents first
    # No tree of 3 nodes does better on this data than the data-built one.
    assert simulated_tau(ranks, tree_from_ranks(ranks, 3, R)) >= simulated_tau(ranks, [(0,), (0, 1), (2,)])


def test_draft_ranks_metric_reports_accuracy_and_chain_tau():
    metric = DraftRanks(max_rank=R, topk=2)
    metric.update(torch.tensor([[0, 0], [1, 0]]))
    metric.update(torch.tensor([[0, 3]]))
    out = metric.compute()
    assert out["top1/d1"].item() == 2 / 3 and out["top2/d1"].item() == 1.0
    assert out["top1/d2"].item() == 2 / 3
    assert out["tau/chain"].item() == 1 + (2 + 0 + 1) / 3
