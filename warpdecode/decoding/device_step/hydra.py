"""Hydra with tensor ops: `drafters/medusa.py`'s sequentially dependent heads. Head d reads the
feature of the last accepted position (`heads.DeviceHeads`) and the embeddings of the pending token
and of the node's path to depth d-1, so the static tree is filled level by level: head d runs once, as
one batch, on every node of depth d-1 that has children, and each child takes its parent's
candidate of its rank. The proposals equal the host drafter's.

Example: paths [(0,), (1,), (0, 0)]: head 1 on [pending] gives the candidates of nodes 0 and 1; head 2
on [pending, token of node 0] gives node 2's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from warpdecode.decoding.device_step.heads import DeviceHeads
from warpdecode.decoding.device_step.state import DeviceState
from warpdecode.decoding.tree_shapes import RankPath
from warpdecode.models.medusa import HydraHeads
from warpdecode.models.transformer import Transformer

if TYPE_CHECKING:
    from warpdecode.decoding.drafters.medusa import HydraDrafter


@dataclass(frozen=True)
class HydraLevel:
    paths: Tensor  # (M, d - 1) int64, the nodes on the path of each parent that has children at depth d
    nodes: Tensor  # (n_d,) int64, the nodes of depth d
    parents: Tensor  # (n_d,) int64, each node's parent as an index into `paths`' rows
    ranks: Tensor  # (n_d,) int64, each node's rank among its parent's candidates


class DeviceHydra(DeviceHeads[HydraHeads]):
    def __init__(self, host: HydraDrafter) -> None:
        super().__init__(host)
        self.levels: list[HydraLevel] = []
        self.embed: torch.nn.Embedding | None = None

    @classmethod
    def of(cls, drafter: HydraDrafter) -> DeviceHydra:
        return cls(drafter)

    def prepare_tree(self, paths: list[RankPath], target: Transformer) -> None:
        super().prepare_tree(paths, target)
        device = target.embed.weight.device
        index = {p: i for i, p in enumerate(paths)}
        self.embed, self.levels = target.embed, []
        for depth in range(1, max((len(p) for p in paths), default=0) + 1):
            nodes = [i for i, p in enumerate(paths) if len(p) == depth]
            parents = sorted({paths[i][:-1] for i in nodes}, key=lambda p: index.get(p, -1))  # node order
            row = {p: r for r, p in enumerate(parents)}
            self.levels.append(HydraLevel(
                paths=torch.tensor([[index[p[:j]] for j in range(1, depth)] for p in parents], dtype=torch.int64,
                                   device=device).reshape(len(parents), depth - 1),
                nodes=torch.tensor(nodes, dtype=torch.int64, device=device),
                parents=torch.tensor([row[paths[i][:-1]] for i in nodes], dtype=torch.int64, device=device),
                ranks=torch.tensor([paths[i][-1] for i in nodes], dtype=torch.int64, device=device),
            ))

    def draft(self, state: DeviceState, room: Tensor) -> tuple[Tensor, Tensor]:
        net, feature, embed = self.net, self.feature, self.embed
        assert net is not None and feature is not None and embed is not None, "prepare() must run first"
        tokens = torch.zeros(self.tree.size, dtype=torch.int64, device=room.device)  # (N,)
        pending = state.pending()  # (1,)
        for depth, level in enumerate(self.levels, start=1):
            M = level.paths.shape[0]
            inputs = torch.cat([pending.expand(M)[:, None], tokens[level.paths]], dim=1)  # (M, depth)
            ranked = self.ranked(net.step(depth, feature.expand(M, -1), embed(inputs)))  # (M, width)
            tokens.index_copy_(0, level.nodes, ranked[level.parents, level.ranks])
        return tokens, self.kept(room)
