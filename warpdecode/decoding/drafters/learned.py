"""What the drafters running a trained drafter package share (EAGLE, Medusa, Hydra).

* `PackagedDrafter.prepare` reads the package once, refuses a package trained for another target
  (`CheckpointError`), rebuilds the network of `net_class` from the package's typed config with
  its frozen head tied to the target (`DrafterPackage.load_net`) and asks for the target's final features.
* Tree shapes (`tree=`): `static`, the rank paths stored with the package (built from validation
  ranks by `metrics.drafting.tree_from_ranks`) cut to `num_nodes` (`auto`: the size with the most
  expected tokens per second on this machine, `decoding/latency.py`); `chain`, `num_tokens` top-1 tokens.
* `fill_shape` turns a shape into a `DraftTree` depth by depth: a node of rank path (r_1, ..., r_d)
  takes candidate r_d of its parent's ranked candidates.

Draft tokens are the drafter's top-ranked ones (deterministic trees, `draft_probs` None): lossless
under every lossless verifier, greedy or sampling.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar, cast

import torch
from torch import Tensor

from warpdecode.decoding.drafters.prompt_lookup import PromptLookupDrafter
from warpdecode.decoding.latency import choose_nodes, verify_seconds
from warpdecode.decoding.protocols import DecodeState, Drafter
from warpdecode.decoding.tree import DraftTree
from warpdecode.decoding.tree_shapes import RankPath, chain
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.draft_head import DraftVocabNet
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.transformer import Transformer

NetT = TypeVar("NetT", bound=DraftVocabNet)


@dataclass(frozen=True)
class ShapeLayout:
    """The nodes of a static shape (rank paths, parents first) as a tree.

    Example: shape [(0,), (1,), (0, 0), (0, 1)] → parents [-1, -1, 0, 0], depths [1, 1, 2, 2],
    ranks [0, 1, 0, 1], expand {0}, width 2.
    """

    parents: list[int]
    depths: list[int]
    ranks: list[int]
    """Each node's rank among its parent's candidates."""
    expand: frozenset[int]
    """Nodes with children."""

    @classmethod
    def of(cls, shape: list[RankPath]) -> ShapeLayout:
        index = {path: i for i, path in enumerate(shape)}
        parents = [index[p[:-1]] if len(p) > 1 else -1 for p in shape]
        return cls(parents, [len(p) for p in shape], [p[-1] for p in shape], frozenset(p for p in parents if p >= 0))

    @property
    def width(self) -> int:
        """Candidates to rank per node: one more than the largest rank."""
        return 1 + max(self.ranks, default=0)

    def path(self, node: int) -> list[int]:
        """The nodes from depth 1 down to `node`."""
        nodes = []
        while node >= 0:
            nodes.append(node)
            node = self.parents[node]
        return nodes[::-1]


RankChildren = Callable[[int, list[int], list[int]], list[list[int]]]
"""`(depth, grow, tokens)` → ranked candidate tokens of each node of `grow` (the nodes at `depth`
that have children, in node order); `tokens` holds every node's token up to `depth`."""


def fill_shape(layout: ShapeLayout, root: list[int], rank_children: RankChildren) -> DraftTree:
    """The tree of `layout`, filled depth by depth from the pending token's ranked candidates `root`."""
    ranked: dict[int, list[int]] = {-1: root}
    tokens = [0] * len(layout.parents)
    for depth in range(1, max(layout.depths, default=0) + 1):
        level = [i for i, d in enumerate(layout.depths) if d == depth]
        for i in level:
            tokens[i] = ranked[layout.parents[i]][layout.ranks[i]]
        grow = [i for i in level if i in layout.expand]
        if grow:
            ranked.update(zip(grow, rank_children(depth, grow, tokens), strict=True))
    return DraftTree(torch.tensor(tokens, dtype=torch.int64), torch.tensor(layout.parents, dtype=torch.int64))


def ranked_tokens(logits: Tensor, draft_vocab: Tensor, width: int) -> list[list[int]]:
    """The `width` best candidates of each row, as target token ids.

    Args:
        logits: (M, N) draft-vocabulary scores.
        draft_vocab: (N,) int64 target token id of each draft-vocabulary entry.
    Returns:
        M lists of `min(width, N)` token ids, best first.
    """
    return draft_vocab[logits.topk(min(width, logits.shape[-1]), dim=-1).indices].tolist()


def to_target_vocab(logits: Tensor, draft_vocab: Tensor, vocab_size: int) -> Tensor:
    """Draft-vocabulary logits (..., N) → target-vocabulary logits (..., V), -inf outside the draft vocabulary.

    Example: logits [2., 1.], draft_vocab [3, 0], vocab_size 4 → [1., -inf, -inf, 2.].
    """
    full = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))
    full[..., draft_vocab] = logits
    return full


class PackagedDrafter(Drafter, ABC, Generic[NetT]):
    """Base of the drafters that run a package of `kind` holding a network of `net_class`; subclasses propose."""

    kind: ClassVar[str]
    net_class: ClassVar[type[DraftVocabNet]]
    trees: ClassVar[tuple[str, ...]] = ("static", "chain")
    needs_training: ClassVar[bool] = True

    def __init__(self, path: str, tree: str, num_nodes: int | str | None, num_tokens: int | None,
                 lookup: int = 0, lookup_scale: bool = True) -> None:
        if lookup < 0:
            raise ConfigError(f"{self.kind} lookup must be >= 0 (0: no prompt lookup), got {lookup}")
        self.copier = PromptLookupDrafter(num_tokens=lookup, scale=lookup_scale) if lookup else None
        """Prompt lookup whose chain is fused into every proposal (`lookup` > 0)."""
        if tree not in self.trees:
            raise ConfigError(f"{self.kind} tree must be one of {', '.join(self.trees)}, got {tree!r}")
        self.auto_nodes = num_nodes == "auto"
        if isinstance(num_nodes, str) and (not self.auto_nodes or tree != "static"):
            raise ConfigError(f"{self.kind} num_nodes must be a number, or 'auto' with the static tree; got {num_nodes!r}")
        nodes = None if isinstance(num_nodes, str) else num_nodes
        for name, value in (("num_nodes", nodes), ("num_tokens", num_tokens)):
            if value is not None and value < 1:
                raise ConfigError(f"{self.kind} {name} must be >= 1, got {value}")
        if not Path(path).exists():
            raise ConfigError(f"{self.kind} drafter package {path!r} not found")
        self.path, self.tree, self.num_nodes, self.num_tokens = path, tree, nodes, num_tokens
        self.needs_hidden_states: tuple[int, ...] = ()
        self.package: DrafterPackage | None = None
        self.net: NetT | None = None
        self.checked: Backbone | None = None
        self.shape: list[RankPath] = []

    @abstractmethod
    def draft(self, state: DecodeState, budget: int) -> DraftTree:
        """The learned network's tree of at most `budget` nodes continuing `state.pending`."""

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        """The learned tree; with `lookup`, fused after the prompt-lookup chain when the context has a
        match (text the answer copies, where learned drafters are weakest), both verified in one forward."""
        learned = self.draft(state, budget)
        if self.copier is None:
            return learned
        copied = self.copier.propose(state, budget)
        return DraftTree.fuse([copied, learned], budget) if copied.size else learned

    def load_net(self, target: Backbone) -> NetT:
        """The package's trained network for `target` (`DrafterPackage.load_net`)."""
        if self.package is None:
            self.package = DrafterPackage.load(self.path, self.kind)
        return cast(NetT, self.package.load_net(target, self.net_class, self.path))

    def prepare(self, target: Backbone) -> None:
        if self.checked is not target:
            net = self.load_net(target)
            with torch.inference_mode(False):
                net.pack()
            self.net, self.checked = net, target
            self.needs_hidden_states = (target.config.n_layer,)
            self.shape = self.tree_shape(net)
            self.attach_graphs(net, onnx=not isinstance(target, Transformer))

    def attach_graphs(self, net: NetT, onnx: bool) -> None:
        """Called for each new target: a drafter exported with ONNX graphs picks them up from its
        package for an ONNX Runtime target (`onnx`), so drafting and verifying share one runtime,
        and keeps its PyTorch network otherwise."""

    def tree_shape(self, net: NetT) -> list[RankPath]:
        """The rank paths of `tree` (static or chain); ConfigError if `net` cannot fill them."""
        assert self.package is not None
        limit = self.max_depth(net)
        if self.tree == "chain":
            length = self.num_tokens or limit
            assert length is not None, "a drafter without a depth limit needs a default num_tokens"
            shape = chain(length)
        else:
            stored = [tuple(p) for p in self.package.tree.get("rank_paths", [])]
            if self.tree == "static" and not stored:
                raise ConfigError(f"{self.path} stores no draft tree (trained without validation, "
                                  "or no validation token ranked high enough to build one); "
                                  f"use tree={' or '.join(t for t in self.trees if t != 'static')}")
            if self.auto_nodes:
                self.num_nodes = self.fastest_size(len(stored))
            shape = stored[: self.num_nodes] if self.num_nodes is not None else stored
        vocab = net.draft_vocab.numel()
        if shape and max(max(p) for p in shape) >= vocab:
            raise ConfigError(f"{self.path}: the tree ranks beyond the {vocab}-token draft vocabulary")
        if limit is not None and shape and max(len(p) for p in shape) > limit:
            raise ConfigError(f"{self.kind} drafts at most {limit} tokens deep (its heads), but the {self.tree} "
                              f"tree is {max(len(p) for p in shape)} deep")
        return shape

    def resolved_settings(self) -> dict[str, Any]:
        """`num_nodes=auto`: the size chosen (see `ResolvesSettings`)."""
        return {"num_nodes": self.num_nodes} if self.auto_nodes and self.num_nodes is not None else {}

    def fastest_size(self, stored: int) -> int:
        """`num_nodes=auto`: the size of the stored tree with the most expected tokens per second on
        this machine, from the package's validation curve τ(n) and the target's measured verify latency."""
        assert self.checked is not None
        curve = self.validation_curve(stored)
        return choose_nodes(curve, verify_seconds(self.checked, len(curve) + 1))

    def validation_curve(self, stored: int) -> list[float]:
        """τ(n) of the stored tree cut to n = 1..`stored` nodes, measured on the validation set."""
        assert self.package is not None
        curve = self.package.training.get("val_tau_by_nodes")
        if not curve:
            raise ConfigError(f"{self.path} records no validation τ per tree size (val_tau_by_nodes); "
                              "give num_nodes, or retrain the drafter with validation")
        return list(curve[:stored])

    def max_depth(self, net: NetT) -> int | None:
        """The deepest draft `net` can make; None when unbounded."""
        return None

    def full_logits(self, logits: Tensor) -> Tensor:
        """(N,) draft-vocabulary logits → (V,) target-vocabulary logits (`to_target_vocab`)."""
        assert self.net is not None and self.checked is not None
        return to_target_vocab(logits, self.net.draft_vocab, self.checked.config.vocab_size)
