"""Medusa with tensor ops: `drafters/medusa.py`'s K heads read the feature of the last accepted
position (`heads.DeviceHeads`) and fill the static tree at once: the node of rank path (r1, ..., rd)
takes head d's rd-th candidate whatever its parent (Medusa's Cartesian-product tree), so the proposals
equal the host drafter's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from warpdecode.decoding.device_step.heads import DeviceHeads
from warpdecode.decoding.device_step.state import DeviceState
from warpdecode.decoding.tree_shapes import RankPath
from warpdecode.models.medusa import MedusaHeads
from warpdecode.models.transformer import Transformer

if TYPE_CHECKING:
    from warpdecode.decoding.drafters.medusa import MedusaDrafter


class DeviceMedusa(DeviceHeads[MedusaHeads]):
    def __init__(self, host: MedusaDrafter) -> None:
        super().__init__(host)
        self.heads = torch.zeros(0, dtype=torch.int64)  # (N,) head of each node (depth - 1)
        self.ranks = torch.zeros(0, dtype=torch.int64)  # (N,) candidate rank of each node

    @classmethod
    def of(cls, drafter: MedusaDrafter) -> DeviceMedusa:
        return cls(drafter)

    def prepare_tree(self, paths: list[RankPath], target: Transformer) -> None:
        super().prepare_tree(paths, target)
        device = target.embed.weight.device
        self.heads = torch.tensor([len(p) - 1 for p in paths], dtype=torch.int64, device=device)
        self.ranks = torch.tensor([p[-1] for p in paths], dtype=torch.int64, device=device)

    def draft(self, state: DeviceState, room: Tensor) -> tuple[Tensor, Tensor]:
        assert self.net is not None and self.feature is not None, "prepare() must run first"
        ranked = self.ranked(self.net(self.feature)[0])  # (K, width): every head at once
        return ranked[self.heads, self.ranks], self.kept(room)
