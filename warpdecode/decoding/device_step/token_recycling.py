"""Token Recycling with tensor ops: `drafters/token_recycling.py` with its (V, k) matrix on the device.

Row x of the matrix holds the top-k tokens the target predicted after input token x, -1 until x has
been an input (the host drafter's `known`). Drafting fills the static tree level by level,
`token = matrix[parent token, rank]`; a node is valid when its parent is and the parent's row is
known, and only the first `room` valid nodes in node order are kept, exactly the nodes the host
drafter proposes. The matrix has one extra row, V, that absorbs the updates of rows that carried no
draft, so that they never overwrite a real row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from warpdecode.decoding.device_step.state import DeviceState, ReadsNoFeatures
from warpdecode.decoding.device_step.tree import StaticTree
from warpdecode.errors import CapabilityError
from warpdecode.models.transformer import Transformer

if TYPE_CHECKING:
    from warpdecode.decoding.drafters.token_recycling import TokenRecyclingDrafter


class DeviceTokenRecycling(ReadsNoFeatures):
    def __init__(self, paths: list[tuple[int, ...]], top_k: int) -> None:
        """Args:
        paths: the static tree's rank paths (the host drafter's `shape`).
        top_k: candidates stored per token.
        """
        self.paths, self.top_k = paths, top_k
        self.tree = StaticTree.of_rank_paths(paths)
        self.matrix: Tensor | None = None  # (V + 1, top_k) int64, -1 for rows never written

    @classmethod
    def of(cls, drafter: TokenRecyclingDrafter) -> DeviceTokenRecycling:
        return cls(drafter.shape, drafter.top_k)

    def prepare(self, target: Transformer) -> None:
        vocab_size, device = target.config.vocab_size, target.embed.weight.device
        if vocab_size < self.top_k:
            raise CapabilityError(f"token_recycling on the device needs top_k ({self.top_k}) <= the vocabulary "
                                  f"({vocab_size})")
        if self.tree.tables.depths.device != device:
            self.tree = StaticTree.of_rank_paths(self.paths, device)
        if self.matrix is None or self.matrix.shape[0] != vocab_size + 1 or self.matrix.device != device:
            self.matrix = torch.full((vocab_size + 1, self.top_k), -1, dtype=torch.int64, device=device)

    def draft(self, state: DeviceState, room: Tensor) -> tuple[Tensor, Tensor]:
        assert self.matrix is not None, "prepare() must run first"
        tree = self.tree
        tokens = torch.cat([state.pending(), torch.zeros(tree.size, dtype=torch.int64, device=room.device)])  # (W,)
        filled = torch.ones(tree.width, dtype=torch.bool, device=room.device)  # (W,)
        for level in tree.levels:  # parents are filled before their children
            parent_tokens = tokens.index_select(0, level.parent_rows)  # -1 (unknown) wraps to the spare row V
            drafted = self.matrix[parent_tokens, level.ranks]  # (n_d,)
            tokens.index_copy_(0, level.nodes + 1, drafted)
            filled.index_copy_(0, level.nodes + 1, filled.index_select(0, level.parent_rows) & (drafted >= 0))
        valid = filled[1:]
        valid &= valid.cumsum(0) <= room  # the first `room` drafted nodes, as the host drafter stops
        return tokens[1:], valid

    def update(self, tokens: Tensor, logits: Tensor, keep: Tensor) -> None:
        assert self.matrix is not None, "prepare() must run first"
        rows = torch.where(keep, tokens, self.matrix.shape[0] - 1)  # rows without a draft go to the spare row
        self.matrix[rows] = logits.topk(self.top_k, dim=-1).indices
