"""What the device forms of the packaged learned drafters (`drafters/learned.py`: Medusa, Hydra, PPD,
EAGLE) share: the package's drafter prepared for the target (it loads and checks the network and
resolves the tree shape), the static tree on the device, and the ranking of draft-vocabulary scores."""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

import torch
from torch import Tensor

from warpdecode.decoding.device_step.tree import AuxiliaryRows, StaticTree
from warpdecode.decoding.tree_shapes import RankPath
from warpdecode.errors import CapabilityError
from warpdecode.models.draft_head import DraftVocabNet
from warpdecode.models.transformer import Transformer

if TYPE_CHECKING:
    from warpdecode.decoding.drafters.learned import PackagedDrafter

NetT = TypeVar("NetT", bound=DraftVocabNet)


class DeviceLearned(Generic[NetT]):
    def __init__(self, host: PackagedDrafter[NetT]) -> None:
        if host.copier is not None:
            raise CapabilityError(f"{host.kind} with lookup= has no device step (the prompt-lookup fusion runs "
                                  "on the host)")
        self.host = host
        self.tree = StaticTree.chain(0)  # until `prepare` knows the target
        self.net: NetT | None = None
        self.width = 1
        self.feature_layers: tuple[int, ...] = ()
        self.auxiliary: AuxiliaryRows | None = None  # PPD's prompt rows (`prepare_tree`)

    def prepare(self, target: Transformer) -> None:
        if self.net is not None and self.host.checked is target:
            return
        self.host.prepare(target)
        assert self.host.net is not None
        paths = [tuple(p) for p in self.host.shape]
        self.net, self.tree = self.host.net, StaticTree.of_rank_paths(paths, target.embed.weight.device)
        self.width = 1 + max((p[-1] for p in paths), default=0)
        self.feature_layers = self.host.needs_hidden_states
        self.prepare_tree(paths, target)

    def prepare_tree(self, paths: list[RankPath], target: Transformer) -> None:
        """The subclass's buffers and index tables, on the target's device."""

    def ranked(self, logits: Tensor) -> Tensor:
        """(M, Nd) draft-vocabulary scores → (M, width) target token ids, best first (`ranked_tokens`)."""
        assert self.net is not None
        return self.net.draft_vocab[logits.topk(min(self.width, logits.shape[-1]), dim=-1).indices]

    def kept(self, room: Tensor) -> Tensor:
        """(N,) bool: the whole tree is drafted; the first `room` nodes in node order are kept, as the
        host drafter cuts its shape to the budget (a node's token depends on its ancestors only)."""
        return torch.arange(1, self.tree.size + 1, device=room.device) <= room

    def update(self, tokens: Tensor, logits: Tensor, keep: Tensor) -> None:
        pass  # learned drafters learn nothing while decoding

    def read_auxiliary(self, logits: Tensor, rows: Tensor, end: Tensor, keep: Tensor) -> None:
        pass  # no auxiliary rows but PPD's
