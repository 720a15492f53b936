"""Medusa-1 and Hydra drafting: K trained heads (`models/medusa.py`) guess the next K tokens.

All the heads read is the target's final feature at the last accepted position, the one that
predicted the pending token (the last row of `state.hidden_states[L]`); head d drafts depth d.

* `medusa`: the heads run once per step. A node at depth d of rank r takes head d's r-th candidate
  whatever its parent (Medusa's Cartesian-product tree: sibling subtrees repeat the same tokens).
* `hydra`: head d also reads the embeddings of the pending token and of the node's path to depth
  d-1, so the tree grows depth by depth: head d runs once, batched, on every node of depth d-1 that
  has children, each with its own path.

Tree shapes (`tree=`): `static` (default; the tree stored with the package) or `chain`, see
`learned.py`; no tree is deeper than the K heads. Deterministic trees: lossless under every lossless
verifier.
"""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import ClassVar, TypeVar

import torch
from torch import Tensor

from warpdecode.decoding.device_step.hydra import DeviceHydra
from warpdecode.decoding.device_step.medusa import DeviceMedusa
from warpdecode.decoding.drafters.learned import PackagedDrafter, ShapeLayout, fill_shape, ranked_tokens
from warpdecode.decoding.protocols import AcceptResult, DecodeState
from warpdecode.decoding.registry import register
from warpdecode.decoding.tree import DraftTree
from warpdecode.models.medusa import FutureHeads, HydraHeads, MedusaHeads
from warpdecode.runtime.onnx_drafters import OnnxHeads

HeadsT = TypeVar("HeadsT", bound=FutureHeads)


class HeadsDrafter(PackagedDrafter[HeadsT]):
    """What Medusa and Hydra share: options, the network, its graphs, the depth limit, no per-request state."""

    onnx_graphs = True

    def __init__(self, path: str, tree: str = "static", num_nodes: int | str | None = None,
                 num_tokens: int | None = None, lookup: int = 0, lookup_scale: bool = True) -> None:
        """Args:
        path: a drafter package trained with `warpdecode fit --config configs/drafters/<kind>.yaml`.
        tree: `static` (the tree stored with the drafter) or `chain`.
        num_nodes: static tree size (default: the stored tree's size); `auto`: the size with the most
            expected tokens per second on this machine, from the stored τ per size and the measured
            verify latency.
        num_tokens: chain length, at most the number of heads (default: all of them).
        lookup: fuse a prompt-lookup chain of up to this many tokens into every proposal whose context
            has a match (0: off).
        lookup_scale: cut the lookup chain after a shorter match in proportion to the match
            (`prompt_lookup.scaled_length`: 4, 7 and 10 tokens of `lookup=10` after 1-, 2- and
            3-token matches); false: up to `lookup` tokens after any match.
        """
        super().__init__(path, tree, num_nodes, num_tokens, lookup, lookup_scale)
        self.graphs: OnnxHeads | None = None
        """The heads' ONNX graphs, used when the target is not a PyTorch model and they exist."""

    def attach_graphs(self, net: HeadsT, onnx: bool) -> None:
        self.graphs = OnnxHeads.find(Path(self.path), net) if onnx else None

    def max_depth(self, net: HeadsT) -> int:
        return net.num_heads

    def start(self, state: DecodeState) -> None:
        """Nothing to set up: the heads keep no state between steps (no cache, unlike EAGLE)."""

    def observe(self, state: DecodeState, result: AcceptResult) -> None:
        """Nothing to update: each step reads the last accepted feature from `state.hidden_states`."""

    @torch.inference_mode()
    def draft(self, state: DecodeState, budget: int) -> DraftTree:
        if budget < 1 or not self.shape:
            return DraftTree.empty()
        feature = state.hidden_states[self.needs_hidden_states[0]][-1:]  # (1, C): predicted the pending token
        return self.fill(ShapeLayout.of(self.shape[:budget]), feature, state.pending)

    @abstractmethod
    def fill(self, layout: ShapeLayout, feature: Tensor, pending: int) -> DraftTree:
        """The tree of `layout` drafted from `feature` (1, C), which predicted the `pending` token."""


@register("drafter", "medusa")
class MedusaDrafter(HeadsDrafter[MedusaHeads]):
    kind = "medusa"
    device_drafter: ClassVar[type[DeviceMedusa]] = DeviceMedusa
    """Its form made of tensor ops, for the device-resident step (`decoding/device_step`)."""

    net_class = MedusaHeads

    def fill(self, layout: ShapeLayout, feature: Tensor, pending: int) -> DraftTree:
        assert self.net is not None, "prepare() must run first"
        logits = (self.graphs or self.net)(feature)[0]  # (K, N)
        ranked = ranked_tokens(logits, self.net.draft_vocab, layout.width)  # per head
        return fill_shape(layout, ranked[0], lambda depth, grow, tokens: [ranked[depth]] * len(grow))


@register("drafter", "hydra")
class HydraDrafter(HeadsDrafter[HydraHeads]):
    kind = "hydra"
    device_drafter: ClassVar[type[DeviceHydra]] = DeviceHydra
    """Its form made of tensor ops, for the device-resident step (`decoding/device_step`)."""

    net_class = HydraHeads

    def fill(self, layout: ShapeLayout, feature: Tensor, pending: int) -> DraftTree:
        net, target = self.net, self.checked
        assert net is not None and target is not None, "prepare() must run first"

        def run(depth: int, paths: list[list[int]]) -> list[list[int]]:
            """Head `depth` on one row per path (the tokens after the pending one, depth - 1 each)."""
            tokens = torch.tensor([[pending] + p for p in paths], device=feature.device)  # (M, depth)
            logits = (self.graphs or net).step(depth, feature.expand(len(paths), -1), target.embed(tokens))
            return ranked_tokens(logits, net.draft_vocab, layout.width)

        def rank_children(depth: int, grow: list[int], tokens: list[int]) -> list[list[int]]:
            return run(depth + 1, [[tokens[j] for j in layout.path(i)] for i in grow])

        return fill_shape(layout, run(1, [[]])[0], rank_children)
