"""Greedy acceptance over a static draft tree, on the device: no host read, fixed shapes.

A static tree is indexed once (`TreeTables.from_parents`, on the host) and then read by every
step. Conventions are `decoding/tree.py`'s: node `i` sits at forward row `i + 1` of the verify
forward over `[pending] + nodes`; `parents[i] == -1` means node `i` continues the pending token.

Worked example (the tree of `decoding/tree.py`):

    pending ─┬─ 0 ── 2
             └─ 1 ── 3 ── 4        parents = [-1, -1, 0, 1, 3]

    parent_rows = [0, 0, 1, 2, 4]      forward row of each node's parent
    depths      = [1, 1, 2, 2, 3]
    preorder    = [0, 2, 1, 3, 4]      depth-first, children in index order: 0, 2, 1, 3, 4
    ancestors[4] = [F, T, F, T, T]     node 4 sees 1, 3 and itself

If the target's argmax after each row is `best` and nodes 1, 3 are correct but 4 is not, the
accepted path is 1 → 3: `accepted = 2`, `rows = [0, 2, 4, 0]` (pending, node 1, node 3, unused),
`emitted = best[rows]` = the tokens of nodes 1 and 3, then the bonus token `best[4]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from warpdecode.kernels.impl import Impl, resolve_impl


@dataclass(frozen=True)
class TreeTables:
    """Index tensors of one static tree of N nodes (W = N + 1 forward rows), built once."""

    parent_rows: Tensor  # (N,) int64, forward row of each node's parent (0: the pending token)
    depths: Tensor  # (N,) int64, 1 for children of the pending token
    ancestors: Tensor  # (N, N) bool, [i, j]: node j is node i or one of its ancestors
    children: Tensor  # (N, N) bool, [i, j]: node j is a child of node i
    preorder: Tensor  # (N,) int64, rank of each node in a depth-first walk, children in index order
    row_depths: Tensor  # (W,) int64, depth of each forward row (0 for the pending token)
    mask: Tensor  # (1, W, W) bool, each row sees itself, its ancestors and the pending token
    max_depth: int
    is_chain: bool
    """Every node is its predecessor's only child: accepted rows are already where they belong."""

    @property
    def size(self) -> int:
        return self.parent_rows.shape[0]

    @classmethod
    def from_parents(cls, parents: Sequence[int], device: torch.device | str = "cpu") -> TreeTables:
        """Tables of the tree whose node `i` has parent `parents[i]` (-1: the pending token; parents
        come before their children)."""
        n = len(parents)
        if any(not -1 <= p < i for i, p in enumerate(parents)):
            raise ValueError(f"parents must precede their children (topological order), got {list(parents)}")
        depths = [0] * n
        ancestors = torch.eye(n, dtype=torch.bool)
        children = torch.zeros(n, n, dtype=torch.bool)
        kids: dict[int, list[int]] = {}
        for i, p in enumerate(parents):
            depths[i] = 1 if p < 0 else depths[p] + 1
            if p >= 0:
                ancestors[i] |= ancestors[p]
                children[p, i] = True
            kids.setdefault(p, []).append(i)
        preorder = [0] * n
        stack = list(reversed(kids.get(-1, [])))
        for rank in range(n):  # every node is reached: each has a parent chain to the pending token
            node = stack.pop()
            preorder[node] = rank
            stack.extend(reversed(kids.get(node, [])))
        mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        mask[:, 0] = True
        mask[1:, 1:] = ancestors
        is_chain = list(parents) == list(range(-1, n - 1))
        return cls(
            parent_rows=torch.tensor([p + 1 for p in parents], dtype=torch.int64, device=device),
            depths=torch.tensor(depths, dtype=torch.int64, device=device),
            ancestors=ancestors.to(device), children=children.to(device),
            preorder=torch.tensor(preorder, dtype=torch.int64, device=device),
            row_depths=torch.tensor([0] + depths, dtype=torch.int64, device=device),
            mask=mask[None].to(device), max_depth=max(depths, default=0), is_chain=is_chain,
        )


def greedy_tree_accept(tokens: Tensor, best: Tensor, valid: Tensor, tables: TreeTables,
                       impl: Impl = "auto") -> tuple[Tensor, Tensor, Tensor]:
    """The path greedy verification accepts (`decoding/verifiers/greedy_match.greedy_accept`): from
    the pending token, step to the first child, in index order, whose token is the target's argmax,
    while there is one. Valid nodes only: a node with `valid` False is never accepted.

    The first-child walk ends at the correct node with no correct child that comes first in the
    depth-first order (`preorder`), so it is found with a fixed number of tensor ops.

    Args:
        tokens: (W,) int64, the verify forward's tokens, pending first (W = N + 1).
        best: (W,) int64, the target's argmax after each forward row.
        valid: (N,) bool, the nodes that carry a drafted token.
        tables: the tree's `TreeTables`.
    Returns:
        accepted: () int64, draft tokens accepted (0..max_depth).
        rows: (max_depth + 1,) int64, forward rows of the kept path, pending first; 0 past `accepted`.
        emitted: (max_depth + 1,) int64, the accepted tokens then the bonus token (valid up to index
            `accepted`): `best[rows]`.
    """
    resolve_impl(impl)
    n = tables.size
    if n == 0:  # plain decoding: a static shape, decided once
        zero = torch.zeros(1, dtype=torch.int64, device=best.device)
        return zero[0], zero, best[:1]
    correct = (tokens[1:] == best.index_select(0, tables.parent_rows)) & valid  # (N,)
    ok = ~(tables.ancestors & ~correct[None, :]).any(1)  # (N,) every node from depth 1 to here correct
    leaf = ok & ~(tables.children & ok[None, :]).any(1)  # (N,) ...and no correct child
    key = torch.where(leaf, tables.preorder, n)  # (N,)
    node = key.argmin().view(1)  # (1,) the walk's end, when one exists (index_select: no host read)
    has = key.min() < n  # ()
    accepted = torch.where(has, tables.depths.index_select(0, node)[0], 0)
    on_path = tables.ancestors.index_select(0, node)[0] & has  # (N,)
    rows = torch.zeros(tables.max_depth + 1, dtype=torch.int64, device=best.device)
    rows.scatter_(0, torch.where(on_path, tables.depths, 0),
                  torch.where(on_path, torch.arange(1, n + 1, device=best.device), 0))
    return accepted, rows, best.index_select(0, rows)


def first_path_accept(tokens: Tensor, best: Tensor, valid: Tensor, first_path: Tensor, success: Tensor,
                      max_depth: int, impl: Impl = "auto") -> tuple[Tensor, Tensor, Tensor]:
    """The oracle verifier's acceptance (`decoding/verifiers/oracle.py`): along the tree's first path
    (the first child at each level), accept each next valid node whose `success` holds, up to the first
    that fails; the bonus token is the target's argmax after the last accepted node.

    Args:
        tokens: (W,) int64, the verify forward's tokens, pending first.
        best: (W,) int64, the target's argmax after each forward row.
        valid: (N,) bool, the nodes that carry a drafted token.
        first_path: (Dp,) int64, the first path's nodes, depth 1 first (Dp <= max_depth).
        success: (Dp,) bool, whether each of them would be accepted.
        max_depth: the tree's depth (rows and emitted have max_depth + 1 entries).
    Returns:
        accepted, rows, emitted as `greedy_tree_accept` returns them.
    """
    resolve_impl(impl)
    device, D, Dp = best.device, max_depth + 1, first_path.shape[0]
    ok = (success & valid.index_select(0, first_path)).to(torch.int64).cumprod(0)  # (Dp,) still accepting
    accepted = ok.sum()
    pad = torch.zeros(D - Dp, dtype=torch.int64, device=device)
    d = torch.arange(D, device=device)
    path_rows = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), first_path + 1, pad[1:]])  # (D,)
    rows = torch.where(d <= accepted, path_rows, 0)
    bonus = best.index_select(0, rows.index_select(0, accepted.view(1)))  # (1,)
    following = torch.cat([tokens.index_select(0, first_path + 1), pad])  # (D,) the token at depth d + 1
    return accepted, rows, torch.where(d < accepted, following, bonus)
