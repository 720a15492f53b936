"""DySpec-style dynamic draft trees (Xiong et al. 2024): grow the tree where the draft is confident.

The draft's probability of a token is a good predictor of its acceptance, so instead of a fixed
shape the tree is grown greedily at run time: every candidate (a child of a tree node, one of that
node's `width` most probable draft tokens) waits in a priority queue keyed by its path probability,
the product of draft probabilities from the pending token down to it. The most probable candidate
joins the tree; while draft forwards remain (`max_expansions`), the joining node is expanded, i.e.
the draft runs on its path and its children become candidates. Growth stops at `num_nodes` nodes.

Example (width 2, 4 nodes, 2 expansions; path probabilities in brackets): "the" [.6] joins and is
expanded ("cat" [.48], "dog" [.06] wait), "cat" joins and is expanded ("sat" [.43], ...), "sat"
joins (no expansions left), then "a" [.3] beats everything still waiting:

    pending ─┬─ 0 "the" [.6] ── 1 "cat" [.48] ── 2 "sat" [.43]
             └─ 3 "a" [.3]

The resulting tree is deterministic given
the draft (greedy verification; the shape depends on drawn tokens, which lossless sampling
verification does not allow, so sampling uses the fixed shapes).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import torch
from torch import Tensor

from warpdecode.decoding.tree import DraftTree

Expand = Callable[[list[int]], Tensor]
"""Draft logits (V,) after a path of draft tokens below the pending token."""


def grow_dynamic_tree(root_logits: Tensor, expand: Expand, num_nodes: int, max_expansions: int, width: int,
                      max_depth: int | None = None) -> DraftTree:
    """The best-first tree of at most `num_nodes` nodes.

    Args:
        root_logits: (V,) draft logits after the pending token.
        expand: the draft's logits after a path (called at most `max_expansions` times, in the
            order nodes join the tree).
        width: candidates per expanded node (its most probable tokens).
        max_depth: deepest node allowed (default: unbounded).
    """
    tokens: list[int] = []
    parents: list[int] = []
    paths: list[list[int]] = []
    queue: list[tuple[float, int, int, int]] = []  # (-log path prob, tie-break, parent, token)
    counter = 0

    def push_children(logits: Tensor, parent: int, base: float) -> None:
        nonlocal counter
        logprobs, children = torch.log_softmax(logits.float(), dim=-1).topk(width)
        for logprob, token in zip(logprobs.tolist(), children.tolist()):
            heapq.heappush(queue, (base - logprob, counter, parent, token))
            counter += 1

    push_children(root_logits, -1, 0.0)
    expansions = 0
    while queue and len(tokens) < num_nodes:
        cost, _, parent, token = heapq.heappop(queue)
        node = len(tokens)
        path = ([] if parent < 0 else paths[parent]) + [token]
        tokens.append(token)
        parents.append(parent)
        paths.append(path)
        if expansions < max_expansions and (max_depth is None or len(path) < max_depth):
            push_children(expand(path), node, cost)
            expansions += 1
    return DraftTree(torch.tensor(tokens, dtype=torch.int64), torch.tensor(parents, dtype=torch.int64))
