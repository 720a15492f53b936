"""EAGLE with tensor ops: `drafters/eagle.py`'s one-block network drafting a static tree on the
device, with its KV cache and its pairs on the device.

Each step, as the host drafter: feed the pairs (target feature, token after it) of the positions the
last verify kept (`observe`; a fixed P = depth + 1 rows, the ones past `count` masked out and
overwritten later) after the `committed` ones, take the feature after the pending token as the root,
then fill the tree depth by depth, one draft forward per depth over every expanded node up to that
depth (their ancestors as the mask, written after the committed pairs and overwritten by the next
depth or step, which is the host drafter's truncation). Every forward is the draft layer's
`forward_static`: slots and lengths are device tensors. The tree is drafted in full and its first
`room` nodes kept, as the host drafter cuts its shape to the budget; a node's token depends only on
its ancestors, so the proposals are the host drafter's.

`tree=static` and `tree=chain`; EAGLE-2's dynamic tree (a host heap) and `lookup=` stay on the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from warpdecode.decoding.device_step.learned import DeviceLearned
from warpdecode.decoding.device_step.state import DeviceState
from warpdecode.decoding.tree_shapes import RankPath
from warpdecode.errors import CapabilityError
from warpdecode.models.cache import KVCache
from warpdecode.models.eagle import EagleNet
from warpdecode.models.transformer import Transformer

if TYPE_CHECKING:
    from warpdecode.decoding.drafters.eagle import EagleDrafter


@dataclass(frozen=True)
class EagleLevel:
    """One draft forward: every expanded node up to depth d, to rank the children of depth d + 1."""

    fed: Tensor  # (F,) int64, the fed nodes, in node order
    parent_rows: Tensor  # (F,) int64, each fed node's parent's row in `outputs` (0: the root)
    depths: Tensor  # (F,) int64
    mask: Tensor  # (1, F, F) bool, each fed node sees itself and its fed ancestors
    grow: Tensor  # (G,) int64, the fed nodes of depth d (their rows among `fed`)
    grow_nodes: Tensor  # (G,) int64, the same as node indices
    children: Tensor  # (n,) int64, the nodes of depth d + 1
    child_parents: Tensor  # (n,) int64, each child's parent as an index into `grow`
    child_ranks: Tensor  # (n,) int64


class DeviceEagle(DeviceLearned[EagleNet]):
    def __init__(self, host: EagleDrafter) -> None:
        if host.tree == "dynamic":
            raise CapabilityError("eagle's dynamic tree has no device step (its best-first heap lives on the host); "
                                  "use tree=static or tree=chain")
        super().__init__(host)
        self.embed: torch.nn.Embedding | None = None
        self.levels: list[EagleLevel] = []
        self.first_nodes = torch.zeros(0, dtype=torch.int64)  # (n1,) the nodes of depth 1
        self.first_ranks = torch.zeros(0, dtype=torch.int64)
        self.caches: dict[int, KVCache] = {}
        self.cache: KVCache | None = None
        self.committed = torch.zeros(1, dtype=torch.int64)  # (1,) true pairs in the draft cache
        self.pair_features: Tensor | None = None  # (P, C) features not fed yet
        self.pair_tokens = torch.zeros(0, dtype=torch.int64)  # (P,) the token after each
        self.pair_count = torch.zeros((), dtype=torch.int64)  # () rows of the pairs that count
        self.pair_mask = torch.zeros(1, 0, 0, dtype=torch.bool)  # (1, P, P) causal
        self.pair_offsets = torch.zeros(0, dtype=torch.int64)  # (P,) 1..P

    @classmethod
    def of(cls, drafter: EagleDrafter) -> DeviceEagle:
        return cls(drafter)

    def prepare_tree(self, paths: list[RankPath], target: Transformer) -> None:
        assert self.net is not None
        device = target.embed.weight.device
        self.embed, self.levels = target.embed, levels(paths, device)
        first = [i for i, p in enumerate(paths) if len(p) == 1]
        self.first_nodes = torch.tensor(first, dtype=torch.int64, device=device)
        self.first_ranks = torch.tensor([paths[i][0] for i in first], dtype=torch.int64, device=device)
        P = self.tree.tables.max_depth + 1
        dtype = self.net.dtype
        self.caches, self.cache = {}, None
        self.committed = torch.zeros(1, dtype=torch.int64, device=device)
        self.pair_features = torch.zeros(P, target.config.d_model, dtype=dtype, device=device)
        self.pair_tokens = torch.zeros(P, dtype=torch.int64, device=device)
        self.pair_count = torch.zeros((), dtype=torch.int64, device=device)
        self.pair_mask = torch.ones(P, P, dtype=torch.bool, device=device).tril()[None]
        self.pair_offsets = torch.arange(1, P + 1, device=device)

    def start(self, hidden: dict[int, Tensor], tokens: Tensor, capacity: int) -> None:
        """Feed the prompt's pairs but the last, which waits in the pairs buffer for the first draft
        (the host drafter feeds all of them there, in one forward)."""
        net = self.net
        assert net is not None and self.pair_features is not None, "prepare() must run first"
        size = capacity + self.tree.width + self.pair_features.shape[0]
        if size not in self.caches:
            self.caches[size] = KVCache(1, 1, net.config.kv_head_count, size, net.config.head_width,
                                        dtype=net.dtype, device=self.committed.device)
        self.cache = self.caches[size]
        features = net.target_feature({j: h.to(net.dtype) for j, h in hidden.items()})  # (n, C)
        n = features.shape[0]
        self.committed.zero_()
        if n > 1:
            self.run(features[:-1], tokens[:-1], self.committed + torch.arange(1, n, device=tokens.device),
                     torch.ones(n - 1, n - 1, dtype=torch.bool, device=tokens.device).tril()[None])
            self.committed.fill_(n - 1)
        self.pair_features[:1] = features[-1:]
        self.pair_tokens[:1] = tokens[-1:]
        self.pair_count.fill_(1)

    def run(self, features: Tensor, tokens: Tensor, positions: Tensor, mask: Tensor) -> Tensor:
        """Feed pairs after the committed ones (written at `committed + arange(T)`); (T, C) predicted
        features. features: (T, C); tokens, positions: (T,) int64; mask: (1, T, T) bool."""
        net, embed, cache = self.net, self.embed, self.cache
        assert net is not None and embed is not None and cache is not None
        x = net.pair_inputs(features[None], tokens[None], embed)  # (1, T, C or 2C)
        limit = net.config.max_seq_len - 1
        out = net.layer.forward_static(tokens[None], positions.clamp(max=limit)[None], self.committed, mask, cache,
                                       hidden_layers=(1,), inputs_embeds=x)
        return out.hidden_states[1][0]

    def draft(self, state: DeviceState, room: Tensor) -> tuple[Tensor, Tensor]:
        net, pairs = self.net, self.pair_features
        assert net is not None and pairs is not None and self.cache is not None, "start() must run first"
        hidden = self.run(pairs, self.pair_tokens, self.committed + self.pair_offsets, self.pair_mask)  # (P, C)
        root = hidden.index_select(0, (self.pair_count - 1).view(1))  # (1, C) after the pending token
        self.committed.add_(torch.where(state.done, 0, self.pair_count))
        outputs = torch.cat([root, root.new_zeros(self.tree.size, root.shape[1])])  # (N + 1, C): root, nodes
        tokens = torch.zeros(self.tree.size, dtype=torch.int64, device=room.device)  # (N,)
        tokens.index_copy_(0, self.first_nodes, self.ranked(net.head(root))[0, self.first_ranks])
        for level in self.levels:
            fed_hidden = self.run(outputs.index_select(0, level.parent_rows), tokens.index_select(0, level.fed),
                                  self.committed + level.depths, level.mask)  # (F, C)
            grown = fed_hidden.index_select(0, level.grow)  # (G, C)
            outputs.index_copy_(0, level.grow_nodes + 1, grown)
            ranked = self.ranked(net.head(grown))  # (G, width)
            tokens.index_copy_(0, level.children, ranked[level.child_parents, level.child_ranks])
        return tokens, self.kept(room)

    def observe(self, hidden: dict[int, Tensor], tokens: Tensor, count: Tensor, keep: Tensor) -> None:
        net, pairs = self.net, self.pair_features
        assert net is not None and pairs is not None, "prepare() must run first"
        features = net.target_feature({j: h.to(pairs.dtype) for j, h in hidden.items()})  # (P, C)
        pairs.copy_(torch.where(keep, features, pairs))
        self.pair_tokens.copy_(torch.where(keep, tokens, self.pair_tokens))
        self.pair_count.copy_(torch.where(keep, count, self.pair_count))


def levels(paths: list[RankPath], device: torch.device) -> list[EagleLevel]:
    """The draft forwards of a static tree (`EagleLevel`), one per depth that has children."""
    index = {p: i for i, p in enumerate(paths)}
    parents = [index[p[:-1]] if len(p) > 1 else -1 for p in paths]
    expanded = sorted({p for p in parents if p >= 0})
    out = []
    for depth in range(1, max((len(p) for p in paths), default=0)):
        fed = [i for i in expanded if len(paths[i]) <= depth]
        grow = [i for i in fed if len(paths[i]) == depth]
        if not grow:
            continue
        local = {node: j for j, node in enumerate(fed)}
        mask = torch.eye(len(fed), dtype=torch.bool)
        for j, node in enumerate(fed):
            if parents[node] >= 0:
                mask[j] |= mask[local[parents[node]]]
        children = [i for i, p in enumerate(paths) if len(p) == depth + 1]

        def tensor(values: list[int]) -> Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        out.append(EagleLevel(
            fed=tensor(fed), parent_rows=tensor([parents[i] + 1 for i in fed]), depths=tensor([len(paths[i]) for i in fed]),
            mask=mask[None].to(device), grow=tensor([local[i] for i in grow]), grow_nodes=tensor(grow),
            children=tensor(children), child_parents=tensor([grow.index(parents[i]) for i in children]),
            child_ranks=tensor([paths[i][-1] for i in children]),
        ))
    return out
