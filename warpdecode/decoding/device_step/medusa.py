"""Medusa with tensor ops: `drafters/medusa.py`'s K heads read the feature of the last accepted
position, kept on the device (`observe`), and fill the static tree at once: the node of rank path
(r1, ..., rd) takes head d's rd-th candidate whatever its parent (Medusa's Cartesian-product tree).
Every node is drafted; only the first `room` in node order are kept, as the host drafter cuts its
shape to the budget, so the proposals equal the host drafter's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from warpdecode.decoding.device_step.state import DeviceState
from warpdecode.decoding.device_step.tree import StaticTree
from warpdecode.errors import CapabilityError
from warpdecode.models.medusa import MedusaHeads
from warpdecode.models.transformer import Transformer

if TYPE_CHECKING:
    from warpdecode.decoding.drafters.medusa import MedusaDrafter


class DeviceMedusa:
    def __init__(self, host: MedusaDrafter) -> None:
        """`host`: the package's drafter, prepared by `prepare` for the target (it loads and checks
        the heads and resolves the tree shape)."""
        if host.copier is not None:
            raise CapabilityError("medusa with lookup= has no device step (the prompt-lookup fusion runs on the host)")
        self.host = host
        self.tree = StaticTree.chain(0)
        self.net: MedusaHeads | None = None
        self.feature: Tensor | None = None  # (1, C), the feature that predicted the pending token
        self.depth_rows = torch.zeros(0, dtype=torch.int64)  # (N,) head of each node (depth - 1)
        self.ranks = torch.zeros(0, dtype=torch.int64)  # (N,) candidate rank of each node
        self.width = 1
        self.feature_layer: int | None = None

    @classmethod
    def of(cls, drafter: MedusaDrafter) -> DeviceMedusa:
        return cls(drafter)

    def prepare(self, target: Transformer) -> None:
        device = target.embed.weight.device
        if self.net is not None and self.host.checked is target:
            return
        self.host.prepare(target)
        assert self.host.net is not None
        self.net, paths = self.host.net, [tuple(p) for p in self.host.shape]
        self.tree = StaticTree.of_rank_paths(paths, device)
        self.depth_rows = torch.tensor([len(p) - 1 for p in paths], dtype=torch.int64, device=device)
        self.ranks = torch.tensor([p[-1] for p in paths], dtype=torch.int64, device=device)
        self.width = 1 + max((p[-1] for p in paths), default=0)
        self.feature_layer = target.config.n_layer
        self.feature = torch.zeros(1, target.config.d_model, dtype=target.embed.weight.dtype, device=device)

    def draft(self, state: DeviceState, room: Tensor) -> tuple[Tensor, Tensor]:
        assert self.net is not None and self.feature is not None, "prepare() must run first"
        logits = self.net(self.feature)[0]  # (K, Nd) draft-vocabulary scores per head
        ranked = self.net.draft_vocab[logits.topk(min(self.width, logits.shape[-1]), dim=-1).indices]  # (K, w)
        tokens = ranked[self.depth_rows, self.ranks]  # (N,)
        valid = torch.arange(1, self.tree.size + 1, device=room.device) <= room
        return tokens, valid

    def update(self, tokens: Tensor, logits: Tensor, keep: Tensor) -> None:
        pass  # the heads learn nothing while decoding

    def observe(self, feature: Tensor, keep: Tensor) -> None:
        assert self.feature is not None, "prepare() must run first"
        self.feature.copy_(torch.where(keep, feature.to(self.feature.dtype), self.feature))
