"""What the device forms of the heads drafters (`drafters/medusa.py`: Medusa, Hydra) share: the
package's drafter prepared for the target (it loads and checks the heads and resolves the tree
shape), the static tree on the device, and the feature of the last accepted position, the one that
predicted the pending token, kept on the device (`observe`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

import torch
from torch import Tensor

from warpdecode.decoding.device_step.tree import StaticTree
from warpdecode.decoding.tree_shapes import RankPath
from warpdecode.errors import CapabilityError
from warpdecode.models.medusa import FutureHeads
from warpdecode.models.transformer import Transformer

if TYPE_CHECKING:
    from warpdecode.decoding.drafters.medusa import HeadsDrafter

NetT = TypeVar("NetT", bound=FutureHeads)


class DeviceHeads(Generic[NetT]):
    def __init__(self, host: HeadsDrafter[NetT]) -> None:
        if host.copier is not None:
            raise CapabilityError(f"{host.kind} with lookup= has no device step (the prompt-lookup fusion runs "
                                  "on the host)")
        self.host = host
        self.tree = StaticTree.chain(0)  # until `prepare` knows the target
        self.net: NetT | None = None
        self.feature: Tensor | None = None  # (1, C)
        self.width = 1
        self.feature_layers: tuple[int, ...] = ()

    def prepare(self, target: Transformer) -> None:
        if self.net is not None and self.host.checked is target:
            return
        self.host.prepare(target)
        assert self.host.net is not None
        device = target.embed.weight.device
        paths = [tuple(p) for p in self.host.shape]
        self.net, self.tree = self.host.net, StaticTree.of_rank_paths(paths, device)
        self.width = 1 + max((p[-1] for p in paths), default=0)
        self.feature_layers = (target.config.n_layer,)
        self.feature = torch.zeros(1, target.config.d_model, dtype=target.embed.weight.dtype, device=device)
        self.prepare_tree(paths, target)

    def prepare_tree(self, paths: list[RankPath], target: Transformer) -> None:
        """Index tables of the subclass's drafting, on the target's device."""

    def ranked(self, logits: Tensor) -> Tensor:
        """(M, Nd) draft-vocabulary scores → (M, width) target token ids, best first (`ranked_tokens`)."""
        assert self.net is not None
        return self.net.draft_vocab[logits.topk(min(self.width, logits.shape[-1]), dim=-1).indices]

    def kept(self, room: Tensor) -> Tensor:
        """(N,) bool: every node is drafted; the first `room` in node order are kept, as the host
        drafter cuts its shape to the budget."""
        return torch.arange(1, self.tree.size + 1, device=room.device) <= room

    def update(self, tokens: Tensor, logits: Tensor, keep: Tensor) -> None:
        pass  # the heads learn nothing while decoding

    def start(self, hidden: dict[int, Tensor], tokens: Tensor, capacity: int) -> None:
        assert self.feature is not None, "prepare() must run first"
        self.feature.copy_(hidden[self.feature_layers[0]][-1:])

    def observe(self, hidden: dict[int, Tensor], tokens: Tensor, count: Tensor, keep: Tensor) -> None:
        assert self.feature is not None, "prepare() must run first"
        last = hidden[self.feature_layers[0]].index_select(0, (count - 1).view(1))  # (1, C)
        self.feature.copy_(torch.where(keep, last.to(self.feature.dtype), self.feature))
