"""EAGLE-style drafting: a trained one-block network drafts on the target's own features (`models/eagle.py`).

Each step the drafter first appends the pairs (target feature, next token) of the tokens the last
verification committed to its KV cache, so its context always holds the target's true features.
Then it drafts a tree: every node is a pair (its parent's predicted feature, its token), and one
draft forward per depth runs all nodes to expand at that depth and their ancestors, under a tree
mask, after the committed pairs; the drafted entries are dropped from the cache afterwards.

Tree shapes (`tree=`): `static` (default) and `chain` as every packaged drafter (`learned.py`), and
`dynamic`: EAGLE-2's best-first tree of `num_nodes` nodes by draft path probability, with
`num_tokens` expansions of `top_k` candidates (`dynamic_tree.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor

from warpdecode.decoding.device_step.eagle import DeviceEagle
from warpdecode.decoding.drafters.dynamic_tree import grow_dynamic_tree
from warpdecode.decoding.drafters.learned import PackagedDrafter, ShapeLayout, fill_shape, ranked_tokens
from warpdecode.decoding.protocols import AcceptResult, DecodeState
from warpdecode.decoding.registry import register
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache
from warpdecode.models.eagle import EagleNet
from warpdecode.runtime.onnx_drafters import OnnxEagle


def ancestor_mask(parents: list[int]) -> Tensor:
    """(1, n, n) bool: entry i sees itself and its ancestors (`parents[i]` < i, -1 for none)."""
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] |= mask[p]
    return mask[None]


@register("drafter", "eagle")
class EagleDrafter(PackagedDrafter[EagleNet]):
    kind = "eagle"
    net_class = EagleNet
    device_drafter: ClassVar[type[DeviceEagle]] = DeviceEagle
    """Its form made of tensor ops, for the device-resident step (`decoding/device_step`): static and
    chain trees."""
    onnx_graphs = True
    trees = ("static", "chain", "dynamic")

    def __init__(self, path: str, tree: str = "static", num_nodes: int | str | None = None, num_tokens: int = 5,
                 top_k: int = 4, lookup: int = 0, lookup_scale: bool = True) -> None:
        """Args:
        path: a drafter package trained with `warpdecode fit --config configs/drafters/eagle.yaml`.
        tree: `static` (the tree stored with the drafter), `chain` or `dynamic` (see the module doc).
        num_nodes: tree size (default: the stored tree's size for `static`, 16 for `dynamic`); `auto` for
            `static`: the size with the most expected tokens per second on this machine, from the
            stored τ per size and the measured verify latency.
        num_tokens: chain length for `chain`; draft forwards (expansions) for `dynamic`.
        top_k: candidates per expanded node for `dynamic`.
        lookup: fuse a prompt-lookup chain of up to this many tokens into every proposal whose context
            has a match (0: off).
        lookup_scale: cut the lookup chain after a shorter match in proportion to the match
            (`prompt_lookup.scaled_length`: 4, 7 and 10 tokens of `lookup=10` after 1-, 2- and
            3-token matches); false: up to `lookup` tokens after any match.
        """
        super().__init__(path, tree, num_nodes, num_tokens, lookup, lookup_scale)
        if top_k < 1:
            raise ConfigError(f"eagle top_k must be >= 1, got {top_k}")
        self.top_k = top_k
        self.cache: KVCache | None = None
        self.committed = 0
        """True pairs in the draft cache."""
        self.pairs: tuple[Tensor, list[int]] | None = None
        """Pairs not yet fed: target features (m, C) and the token after each."""
        self.graphs: OnnxEagle | None = None
        """The network's ONNX graphs, used when the target is not a PyTorch model and they exist."""

    def attach_graphs(self, net: EagleNet, onnx: bool) -> None:
        self.graphs = OnnxEagle.find(Path(self.path), net) if onnx else None

    @property
    def network(self) -> EagleNet | OnnxEagle:
        """What drafts: the ONNX graphs on an ONNX Runtime target (when exported), else the PyTorch network."""
        assert self.net is not None, "prepare() must run first"
        return self.graphs or self.net

    def prepare(self, target: Backbone) -> None:
        super().prepare(target)
        assert self.net is not None
        self.needs_hidden_states = self.net.feature_layers

    def start(self, state: DecodeState) -> None:
        assert self.net is not None, "prepare() must run first"
        self.cache = KVCache.for_model(self.net.config, 1, state.cache.max_len, dtype=self.net.dtype,
                                       device=state.cache.k[0].device)
        self.committed = 0
        self.pairs = (self.target_feature(state), state.tokens[1:])  # features after each prompt token

    def observe(self, state: DecodeState, result: AcceptResult) -> None:
        # The verify forward's features after the old pending token and each accepted node; the
        # token after each is the next accepted token, then the bonus token.
        self.pairs = (self.target_feature(state), result.tokens)

    @torch.inference_mode()
    def target_feature(self, state: DecodeState) -> Tensor:
        """(m, C) the target's features of the last forward's kept rows (fused from several layers by the
        PyTorch network, also on an ONNX Runtime target)."""
        assert self.net is not None
        return self.net.target_feature({j: state.hidden_states[j].to(self.net.dtype)
                                        for j in self.net.feature_layers})

    def run(self, features: Tensor, tokens: list[int], depths: list[int], mask: Tensor | None) -> Tensor:
        """Feed pairs after the committed ones; (n, C) predicted features (logits: `self.network.head`).

        Args:
            features: (n, C) input features; `depths`: position offset of each pair after the committed ones.
            mask: (1, n, n) bool among the new pairs, None for causal.
        """
        assert self.net is not None and self.checked is not None and self.cache is not None
        positions = torch.tensor([[self.committed + d for d in depths]], device=features.device)
        hidden, _ = self.network(features[None], torch.tensor([tokens], device=features.device), self.checked.embed,
                                 positions, self.cache, mask, logits_slice=slice(0, 0))
        return hidden[0]

    @torch.inference_mode()
    def draft(self, state: DecodeState, budget: int) -> DraftTree:
        assert self.net is not None and self.cache is not None and self.pairs is not None, "start() must run first"
        features, tokens = self.pairs
        self.pairs = None
        feature = self.run(features, tokens, list(range(1, len(tokens) + 1)), None)[-1]  # after the pending token
        self.committed += len(tokens)
        root = (feature, self.network.head(feature))
        if budget < 1:
            return DraftTree.empty()
        tree = self.dynamic(root, budget) if self.tree == "dynamic" else self.fill(root, budget)
        self.cache.truncate(self.committed)
        return tree

    def fill(self, root: tuple[Tensor, Tensor], budget: int) -> DraftTree:
        """The static shape's nodes, filled depth by depth; one draft forward per depth."""
        assert self.net is not None
        layout = ShapeLayout.of(self.shape[:budget])
        vocab = self.net.draft_vocab
        outputs: dict[int, Tensor] = {-1: root[0]}

        def rank_children(depth: int, grow: list[int], tokens: list[int]) -> list[list[int]]:
            # The draft cache holds only committed pairs: feed every expanded node up to this depth.
            fed = [i for i in sorted(layout.expand) if layout.depths[i] <= depth]
            local = {node: j for j, node in enumerate(fed)}
            inputs = torch.stack([outputs[layout.parents[i]] for i in fed])
            mask = ancestor_mask([local.get(layout.parents[i], -1) for i in fed])
            hidden = self.run(inputs, [tokens[i] for i in fed], [layout.depths[i] for i in fed], mask)
            self.cache.truncate(self.committed)  # type: ignore[union-attr]
            for i in grow:
                outputs[i] = hidden[local[i]]
            return ranked_tokens(self.network.head(hidden[[local[i] for i in grow]]), vocab, layout.width)

        return fill_shape(layout, ranked_tokens(root[1][None], vocab, layout.width)[0], rank_children)

    def dynamic(self, root: tuple[Tensor, Tensor], budget: int) -> DraftTree:
        """EAGLE-2's dynamic tree: best-first by draft path probability (`grow_dynamic_tree`)."""
        assert self.num_tokens is not None  # an int option of this drafter
        outputs: dict[tuple[int, ...], Tensor] = {(): root[0]}

        def expand(path: list[int]) -> Tensor:
            inputs = torch.stack([outputs[tuple(path[:j])] for j in range(len(path))])
            hidden = self.run(inputs, path, list(range(1, len(path) + 1)), None)[-1]
            self.cache.truncate(self.committed)  # type: ignore[union-attr]
            outputs[tuple(path)] = hidden
            return self.full_logits(self.network.head(hidden))

        return grow_dynamic_tree(self.full_logits(root[1]), expand, min(self.num_nodes or 16, budget),
                                 self.num_tokens, self.top_k)
