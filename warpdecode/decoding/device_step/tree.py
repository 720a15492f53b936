"""A static draft tree on the device, built once per method from rank paths (`tree_shapes`).

Node `i` is rank path `paths[i]`; its parent is the path without its last rank. Nodes are filled
level by level (`levels`): a node at depth d takes the `ranks[i]`-th candidate after its parent's
token. Index conventions are those of `decoding/tree.py` (see `kernels.tree_accept.TreeTables`).

Example: paths [(0,), (1,), (0, 0)] → parents [-1, -1, 0], ranks [0, 1, 0],
levels [(nodes [0, 1], parent rows [0, 0], ranks [0, 1]), (nodes [2], parent rows [1], ranks [0])].

`AuxiliaryRows`: rows a verify forward runs after the tree's for the drafter's own use (PPD's prompt
rows, `decoding/tree.py`'s auxiliary nodes): never verified, accepted or committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from warpdecode.decoding.tree_shapes import RankPath, chain
from warpdecode.kernels.tree_accept import TreeTables


@dataclass(frozen=True)
class Level:
    nodes: Tensor  # (n_d,) int64, the nodes at this depth
    parent_rows: Tensor  # (n_d,) int64, their parents' forward rows
    ranks: Tensor  # (n_d,) int64, the candidate rank each takes after its parent's token


@dataclass(frozen=True)
class StaticTree:
    paths: tuple[RankPath, ...]
    tables: TreeTables
    levels: tuple[Level, ...]

    @property
    def size(self) -> int:
        """N, the tree's nodes."""
        return len(self.paths)

    @property
    def width(self) -> int:
        """W = N + 1, the rows of a verify forward (the pending token first)."""
        return len(self.paths) + 1

    @classmethod
    def of_rank_paths(cls, paths: Sequence[RankPath], device: torch.device | str = "cpu") -> StaticTree:
        """The tree of `paths`, each path's parent listed before it (as `best_rank_paths` gives them)."""
        index: dict[RankPath, int] = {}
        parents: list[int] = []
        for i, path in enumerate(paths):
            if not path or (len(path) > 1 and path[:-1] not in index) or path in index:
                raise ValueError(f"rank path {path} needs its parent listed before it, once; got {list(paths)}")
            parents.append(index[path[:-1]] if len(path) > 1 else -1)
            index[path] = i
        tables = TreeTables.from_parents(parents, device)
        depths = [len(p) for p in paths]
        levels = []
        for d in range(1, tables.max_depth + 1):
            nodes = [i for i, x in enumerate(depths) if x == d]
            levels.append(Level(
                nodes=torch.tensor(nodes, dtype=torch.int64, device=device),
                parent_rows=torch.tensor([parents[i] + 1 for i in nodes], dtype=torch.int64, device=device),
                ranks=torch.tensor([paths[i][-1] for i in nodes], dtype=torch.int64, device=device),
            ))
        return cls(tuple(paths), tables, tuple(levels))

    def first_path(self) -> list[int]:
        """The nodes of the first root-to-leaf path: the first child (in node order) at each level."""
        children: dict[tuple[int, ...], list[int]] = {}
        for i, p in enumerate(self.paths):
            children.setdefault(p[:-1], []).append(i)
        out: list[int] = []
        node: tuple[int, ...] = ()
        while children.get(node):
            first = min(children[node])
            out.append(first)
            node = self.paths[first]
        return out

    @classmethod
    def chain(cls, length: int, device: torch.device | str = "cpu") -> StaticTree:
        """A chain of `length` nodes (length 0: plain decoding)."""
        return cls.of_rank_paths(chain(length), device)

    def parents(self) -> list[int]:
        """Each node's parent node (-1: the pending token)."""
        return (self.tables.parent_rows - 1).tolist()


@dataclass(frozen=True)
class AuxiliaryRows:
    """A rows after a static tree's W in every verify forward, run with input embeddings of their own
    (they have no token), each continuing a tree node, the pending token or an earlier auxiliary row:
    the drafter reads their outputs; they are never verified, accepted or committed (the static
    form writes their keys and values past the tree's slots, where the next step overwrites them).

    Example: tree paths [(0,)] and one row after the pending token and one after node 0 → node
    parents [-1, -1, 0], `row_depths` [0, 1, 1, 2].
    """

    embeds: Tensor  # (A, C) block inputs, in the target's dtype
    row_depths: Tensor  # (W + A,) int64, depth of every forward row, the tree's first
    mask: Tensor  # (1, W + A, W + A) bool, each row sees itself, its ancestors and the pending token
    sent: Tensor  # (A,) bool, the rows this step's draft uses (the drafter writes it; the eager form runs these)
    index: Tensor  # (A,) int64, 0..A-1

    @property
    def size(self) -> int:
        """A, the auxiliary rows."""
        return self.index.shape[0]

    @classmethod
    def after(cls, tree: StaticTree, parents: Sequence[int], embeds: Tensor) -> AuxiliaryRows:
        """Rows after `tree`: row a continues node `parents[a]` (-1: the pending token; N + b: auxiliary
        row b < a, N = tree nodes); `embeds` (A, C) their block inputs."""
        if embeds.shape[0] != len(parents):
            raise ValueError(f"embeds {tuple(embeds.shape)} must have one row per auxiliary row ({len(parents)})")
        device = tree.tables.depths.device
        tables = TreeTables.from_parents([*tree.parents(), *parents], device)
        return cls(embeds.to(device), tables.row_depths, tables.mask,
                   torch.zeros(len(parents), dtype=torch.bool, device=device),
                   torch.arange(len(parents), device=device))
