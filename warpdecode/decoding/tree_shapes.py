"""Static draft-tree shapes: which candidate ranks to expand, as Medusa-style rank paths.

A shape is a list of rank paths. Path `(0, 2)` is "the parent's best candidate, then that node's
third-best candidate". A drafter that knows, for any token, a ranked list of likely next tokens
(Token Recycling's adjacency matrix, Medusa heads) fills a shape into a `DraftTree`.

`best_rank_paths` picks the `num_nodes` paths of highest estimated acceptance probability, taking
rank r at any depth to be accepted with probability `rank_accept[r]` (independent across depths):
the expected number of accepted tokens of a tree is the sum over its nodes of their path
probabilities, so this greedy choice maximises it for a node budget (Medusa's and Sequoia's
argument). Sorted by decreasing probability, every parent comes before its children.
"""

from __future__ import annotations

import heapq

RankPath = tuple[int, ...]



def chain(depth: int) -> list[RankPath]:
    """The rank paths of a chain of `depth` top-1 tokens: (0,), (0, 0), ..."""
    return [(0,) * d for d in range(1, depth + 1)]


DEFAULT_RANK_ACCEPT = (0.45, 0.15, 0.08, 0.05, 0.035, 0.025, 0.02, 0.015)
"""Per-rank acceptance estimates used when nothing has been measured (decreasing with rank)."""


def best_rank_paths(num_nodes: int, rank_accept: tuple[float, ...] = DEFAULT_RANK_ACCEPT,
                    max_depth: int = 16) -> list[RankPath]:
    """The `num_nodes` rank paths of highest product of `rank_accept`, most probable first.

    Example: rank_accept = (0.5, 0.2), num_nodes = 4 → [(0,), (0, 0), (1,), (0, 0, 0)]
    (probabilities 0.5, 0.25, 0.2, 0.125).
    """
    if num_nodes < 0 or not rank_accept or not all(0 < p < 1 for p in rank_accept):
        raise ValueError(f"need num_nodes >= 0 and rank probabilities in (0, 1), got {num_nodes}, {rank_accept}")
    chosen: list[RankPath] = []
    frontier: list[tuple[float, RankPath]] = [(-rank_accept[0], (0,))]
    while frontier and len(chosen) < num_nodes:
        negative, path = heapq.heappop(frontier)
        chosen.append(path)
        rank = path[-1]
        if rank + 1 < len(rank_accept):  # the next sibling
            heapq.heappush(frontier, (negative / rank_accept[rank] * rank_accept[rank + 1], path[:-1] + (rank + 1,)))
        if len(path) < max_depth:  # the first child
            heapq.heappush(frontier, (negative * rank_accept[0], path + (0,)))
    return chosen
