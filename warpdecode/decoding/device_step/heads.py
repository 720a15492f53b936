"""What the device forms of the heads drafters (`drafters/medusa.py`: Medusa, Hydra) add to
`learned.DeviceLearned`: the feature of the last accepted position, the one that predicted the pending
token, kept on the device (`start`, `observe`)."""

from __future__ import annotations

import torch
from torch import Tensor

from warpdecode.decoding.device_step.learned import DeviceLearned, NetT
from warpdecode.decoding.tree_shapes import RankPath
from warpdecode.models.transformer import Transformer


class DeviceHeads(DeviceLearned[NetT]):
    feature: Tensor | None = None  # (1, C)

    def prepare_tree(self, paths: list[RankPath], target: Transformer) -> None:
        self.feature = torch.zeros(1, target.config.d_model, dtype=target.embed.weight.dtype,
                                   device=target.embed.weight.device)

    def start(self, hidden: dict[int, Tensor], tokens: Tensor, capacity: int) -> None:
        assert self.feature is not None, "prepare() must run first"
        self.feature.copy_(hidden[self.feature_layers[0]][-1:])

    def observe(self, hidden: dict[int, Tensor], tokens: Tensor, count: Tensor, keep: Tensor) -> None:
        assert self.feature is not None, "prepare() must run first"
        last = hidden[self.feature_layers[0]].index_select(0, (count - 1).view(1))  # (1, C)
        self.feature.copy_(torch.where(keep, last.to(self.feature.dtype), self.feature))
