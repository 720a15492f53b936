"""Token Recycling (Luo et al. 2024): draft trees from the candidates the target already produced.

Every target forward yields, for each input token x, a next-token distribution; its top-k tokens
are stored as row x of an adjacency matrix `(V, k)` (a few MB; for SmolLM2 49152 × 8 int32 = 1.5 MB),
overwriting the previous row. Candidates of rejected branches are recycled too. To draft, a static
tree shape (rank paths, see `tree_shapes`) is filled breadth-first from the pending token: node
`(r1, r2)` is `M[M[pending][r1]][r2]`. Tokens never seen as an input have no row and get no
children. The matrix lives as long as the drafter, across requests, as in the paper.

Lossless with any lossless verifier (the drafts are deterministic proposals).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from warpdecode.decoding.device_step.token_recycling import DeviceTokenRecycling
from warpdecode.decoding.protocols import AcceptResult, DecodeState, Drafter
from warpdecode.decoding.registry import register
from warpdecode.decoding.tree import DraftTree
from warpdecode.decoding.tree_shapes import best_rank_paths
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone


@register("drafter", "token_recycling")
class TokenRecyclingDrafter(Drafter):
    supports_batch: ClassVar[bool] = True
    device_drafter: ClassVar[type[DeviceTokenRecycling]] = DeviceTokenRecycling
    """Its form made of tensor ops, for the device-resident step (`decoding/device_step`)."""

    def __init__(self, top_k: int = 8, num_nodes: int = 8, max_depth: int = 8) -> None:
        """Args:
        top_k: candidates stored per token (matrix columns); ranks beyond it are never drafted.
        num_nodes: draft tree size (the static shape's nodes; fewer where rows are missing). 8 was the best
            of 8/16/24/40 on a 2-core CPU, where verify cost grows with every row; GPUs afford far larger trees.
        max_depth: deepest draft level.
        """
        if top_k < 1 or num_nodes < 1 or max_depth < 1:
            raise ConfigError(f"token_recycling needs top_k, num_nodes, max_depth >= 1, got {top_k}, {num_nodes}, {max_depth}")
        self.top_k, self.num_nodes, self.max_depth = top_k, num_nodes, max_depth
        self.shape = [p for p in best_rank_paths(num_nodes * 4, max_depth=max_depth) if max(p) < top_k][:num_nodes]
        self.matrix: torch.Tensor | None = None  # (V, top_k) int64 candidates per token
        self.known: torch.Tensor | None = None  # (V,) bool, rows written at least once

    def prepare(self, target: Backbone) -> None:
        vocab = target.config.vocab_size
        if self.matrix is None or self.matrix.shape[0] != vocab:
            self.matrix = torch.zeros(vocab, self.top_k, dtype=torch.int64)
            self.known = torch.zeros(vocab, dtype=torch.bool)

    def start(self, state: DecodeState) -> None:
        self.recycle(state)

    def recycle(self, state: DecodeState) -> None:
        """Store the top-k candidates after every input token of the last target forward."""
        assert self.matrix is not None and self.known is not None, "prepare() must run first"
        if state.forward_tokens is None or state.forward_logits is None:
            return
        k = min(self.top_k, state.forward_logits.shape[-1])
        rows = state.forward_tokens.cpu()
        self.matrix[rows, :k] = state.forward_logits.topk(k, dim=-1).indices.cpu()
        self.known[rows] = True

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        assert self.matrix is not None and self.known is not None, "prepare() must run first"
        matrix, known = self.matrix, self.known
        rows: dict[int, list[int] | None] = {}

        def candidates(token: int) -> list[int] | None:
            if token not in rows:
                rows[token] = matrix[token].tolist() if bool(known[token]) else None
            return rows[token]

        index: dict[tuple[int, ...], int] = {}  # rank path → node
        tokens: list[int] = []
        parents: list[int] = []
        for path in self.shape:  # parents come before children
            if len(tokens) >= budget:
                break
            parent = index.get(path[:-1], -1) if len(path) > 1 else -1
            if parent < 0 and len(path) > 1:
                continue  # the parent was not drafted
            row = candidates(state.pending if parent < 0 else tokens[parent])
            if row is None:
                continue
            index[path] = len(tokens)
            tokens.append(row[path[-1]])
            parents.append(parent)
        return DraftTree(torch.tensor(tokens, dtype=torch.int64), torch.tensor(parents, dtype=torch.int64))

    def observe(self, state: DecodeState, result: AcceptResult) -> None:
        self.recycle(state)
