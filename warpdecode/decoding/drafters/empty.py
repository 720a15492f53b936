"""The empty drafter: plain autoregressive decoding, one token per target forward."""

from __future__ import annotations

from typing import ClassVar

from warpdecode.decoding.protocols import AcceptResult, DecodeState, Drafter
from warpdecode.decoding.registry import register
from warpdecode.decoding.tree import DraftTree
from warpdecode.models.backbone import Backbone


@register("drafter", "none")
class EmptyDrafter(Drafter):
    supports_batch: ClassVar[bool] = True
    drafts: ClassVar[bool] = False

    def prepare(self, target: Backbone) -> None:
        pass

    def start(self, state: DecodeState) -> None:
        pass

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        return DraftTree.empty()

    def observe(self, state: DecodeState, result: AcceptResult) -> None:
        pass
