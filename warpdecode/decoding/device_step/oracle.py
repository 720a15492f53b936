"""The oracle drafter with tensor ops: `drafters/oracle.py`'s fixed tree of placeholder tokens (a
chain of `num_tokens` nodes, then `width - 1` siblings of its first node, every token the pending
one), for timing the device step at a chosen τ with the oracle verifier (`first_path_accept`) on any
target, random weights included. The first `room` nodes in node order are kept, as the host drafter
cuts its tree to the budget."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from warpdecode.decoding.device_step.state import DeviceState, ReadsNoFeatures
from warpdecode.decoding.device_step.tree import StaticTree
from warpdecode.models.transformer import Transformer

if TYPE_CHECKING:
    from warpdecode.decoding.drafters.oracle import OracleDrafter


class DeviceOracle(ReadsNoFeatures):
    def __init__(self, num_tokens: int, width: int) -> None:
        self.paths = [(0,) * d for d in range(1, num_tokens + 1)] + [(r,) for r in range(1, width)]
        self.tree = StaticTree.of_rank_paths(self.paths)

    @classmethod
    def of(cls, drafter: OracleDrafter) -> DeviceOracle:
        return cls(drafter.num_tokens, drafter.width)

    def prepare(self, target: Transformer) -> None:
        device = target.embed.weight.device
        if self.tree.tables.depths.device != device:
            self.tree = StaticTree.of_rank_paths(self.paths, device)

    def draft(self, state: DeviceState, room: Tensor) -> tuple[Tensor, Tensor]:
        tokens = state.pending().expand(self.tree.size).clone()  # (N,)
        return tokens, torch.arange(1, self.tree.size + 1, device=room.device) <= room

