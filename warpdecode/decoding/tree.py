"""Draft trees: the candidate continuations a drafter proposes for one verify forward.

Nodes are stored in topological order (a parent before its children). `parents[i] == -1` means node
`i` continues the *pending* token, the last selected token that is not in the KV cache yet; the
verify forward runs over `[pending] + tree.tokens`, so tree node `i` sits at forward index `i + 1`.

Example (a chain is the special case of one child per node):

    pending ─┬─ 0 "the" ── 2 "cat"
             └─ 1 "a"   ── 3 "dog" ── 4 "ran"

    tokens  = [the, a, cat, dog, ran]
    parents = [-1, -1, 0, 1, 3]
    depths  = [1, 1, 2, 2, 3]          # the pending token has depth 0
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class DraftTree:
    tokens: Tensor  # (N,) int64
    parents: Tensor  # (N,) int64, -1 for children of the pending token
    draft_probs: Tensor | None = None  # (N, V) float32: distribution each node's token was drawn from; None = deterministic
    auxiliary: int = 0
    """The last `auxiliary` nodes ride along in the verify forward for the drafter's own use (e.g.
    lookahead's Jacobi window) and are never verified or accepted; see `verified`."""
    auxiliary_embeds: Tensor | None = None
    """(auxiliary, C) input embeddings the auxiliary nodes run with instead of their tokens'
    (trained prompt tokens outside the vocabulary: PPD); their `tokens` are then placeholders."""

    def __post_init__(self) -> None:
        n = self.tokens.shape[0]
        if not 0 <= self.auxiliary <= n:
            raise ValueError(f"auxiliary must be in [0, {n}], got {self.auxiliary}")
        if self.tokens.dim() != 1 or self.parents.shape != (n,):
            raise ValueError(f"tokens {tuple(self.tokens.shape)} and parents {tuple(self.parents.shape)} must be (N,)")
        if n and bool((self.parents >= torch.arange(n)).any()):
            raise ValueError(f"parents must precede their children (topological order), got {self.parents.tolist()}")
        if self.draft_probs is not None and self.draft_probs.shape[0] != n:
            raise ValueError(f"draft_probs {tuple(self.draft_probs.shape)} must have one row per node ({n})")
        if self.auxiliary_embeds is not None and (self.auxiliary_embeds.dim() != 2
                                                  or self.auxiliary_embeds.shape[0] != self.auxiliary):
            raise ValueError(f"auxiliary_embeds {tuple(self.auxiliary_embeds.shape)} must be ({self.auxiliary}, C)")

    @classmethod
    def empty(cls) -> DraftTree:
        return cls(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))

    @classmethod
    def chain(cls, tokens: list[int] | Tensor, draft_probs: Tensor | None = None) -> DraftTree:
        tokens = torch.as_tensor(tokens, dtype=torch.int64)
        return cls(tokens, torch.arange(tokens.shape[0]) - 1, draft_probs)

    @property
    def size(self) -> int:
        return self.tokens.shape[0]

    def depths(self) -> Tensor:
        """(N,) int64 depth of each node; children of the pending token have depth 1."""
        depth = torch.zeros(self.size, dtype=torch.int64)
        for i, p in enumerate(self.parents.tolist()):
            depth[i] = 1 if p < 0 else depth[p] + 1
        return depth

    def verified(self) -> DraftTree:
        """The candidates: this tree without its auxiliary nodes (they come last, so no candidate
        descends from one)."""
        if not self.auxiliary:
            return self
        n = self.size - self.auxiliary
        probs = None if self.draft_probs is None else self.draft_probs[:n]
        return DraftTree(self.tokens[:n], self.parents[:n], probs)

    def cut(self, depth: int) -> DraftTree:
        """The nodes of depth <= `depth` (the whole tree when it is no deeper). Example: the chain
        a → b → c cut to depth 1 is a; a tree a → (b, c), d cut to 1 is a, d."""
        if depth >= self.depth:
            return self
        kept = (self.depths() <= depth).nonzero().squeeze(1)  # (K,) node indices, in topological order
        index = torch.full((self.size + 1,), -1, dtype=torch.int64)  # old node + 1 -> new node (slot 0: the root, -1)
        index[kept + 1] = torch.arange(kept.shape[0])
        probs = None if self.draft_probs is None else self.draft_probs[kept]
        return DraftTree(self.tokens[kept], index[self.parents[kept] + 1], probs)

    @property
    def depth(self) -> int:
        """Longest root-to-leaf path: the most draft tokens one step can accept."""
        return int(self.depths().max()) if self.size else 0

    def children(self) -> dict[int, list[int]]:
        """Parent node (-1: the pending token) → its child node indices, in proposal order."""
        out: dict[int, list[int]] = {}
        for child, parent in enumerate(self.parents.tolist()):
            out.setdefault(parent, []).append(child)
        return out

    @classmethod
    def fuse(cls, trees: list[DraftTree], budget: int) -> DraftTree:
        """One tree holding every root-to-node path of `trees` once (tree fusion by longest common
        prefix), earlier trees first, at most `budget` nodes. Deterministic trees only.

        Example: chains [a, b, c] and [a, d] fuse into a → (b → c, d): 4 nodes, not 5.
        Auxiliary nodes are dropped: only candidates are fused.
        """
        if any(t.draft_probs is not None for t in trees):
            raise ValueError("only deterministic draft trees (draft_probs None) can be fused")
        index: dict[tuple[int, ...], int] = {}
        tokens: list[int] = []
        parents: list[int] = []
        for tree in trees:
            for path in tree.verified().path_tokens():
                if len(tokens) >= budget:
                    break
                if path not in index and (len(path) == 1 or path[:-1] in index):
                    index[path] = len(tokens)
                    tokens.append(path[-1])
                    parents.append(index[path[:-1]] if len(path) > 1 else -1)
        return cls(torch.tensor(tokens, dtype=torch.int64), torch.tensor(parents, dtype=torch.int64))

    def path_tokens(self) -> list[tuple[int, ...]]:
        """Each node's tokens from depth 1 down to the node itself (N entries).

        Example (the tree above): [(the,), (a,), (the, cat), (a, dog), (a, dog, ran)].
        """
        tokens = self.tokens.tolist()
        paths: list[tuple[int, ...]] = []
        for i, p in enumerate(self.parents.tolist()):
            paths.append((paths[p] if p >= 0 else ()) + (tokens[i],))
        return paths

    def verify_inputs(self, pending: int, start: int) -> tuple[Tensor, Tensor, Tensor]:
        """Tokens, positions and tree mask of the verify forward over `[pending] + tree`.

        Returns:
            tokens: (1, N+1) int64; positions: (1, N+1) int64 (`start + depth`);
            mask: (1, N+1, N+1) bool, each entry sees itself, its ancestors and the pending token.
        """
        n = self.size + 1
        parents = torch.cat([torch.tensor([-1]), self.parents + 1])  # forward indices; pending is 0
        mask = torch.eye(n, dtype=torch.bool)
        for i in range(1, n):  # topological order: a parent's row is complete before its children
            mask[i] |= mask[parents[i]]
        depths = torch.cat([torch.zeros(1, dtype=torch.int64), self.depths()])
        tokens = torch.cat([torch.tensor([pending]), self.tokens])
        return tokens[None], (start + depths)[None], mask[None]

    def verify_embeds(self, embed: nn.Embedding, tokens: Tensor) -> Tensor | None:
        """(1, N+1, C) block inputs of the verify forward over `tokens` (1, N+1) (`verify_inputs`): the
        token embeddings with `auxiliary_embeds` in the auxiliary rows; None when there are none."""
        if self.auxiliary_embeds is None:
            return None
        x = embed(tokens)
        x[0, x.shape[1] - self.auxiliary :] = self.auxiliary_embeds.to(x.dtype)
        return x
