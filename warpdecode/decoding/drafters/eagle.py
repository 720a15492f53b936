"""EAGLE-style drafting: a trained one-block network drafts on the target's own features (`models/eagle.py`).

Each step the drafter first appends the pairs (target feature, next token) of the tokens the last
verification committed to its KV cache, so its context always holds the target's true features.
Then it drafts a tree: every node is a pair (its parent's predicted feature, its token), and one
draft forward per depth runs all nodes to expand at that depth and their ancestors, under a tree
mask, after the committed pairs; the drafted entries are dropped from the cache afterwards.

Tree shapes (`tree=`):
* `static` (default): the rank paths stored with the drafter, built from its validation ranks
  (`metrics.drafting.tree_from_ranks`), cut to `num_nodes`;
* `chain`: `num_tokens` top-1 tokens;
* `dynamic`: EAGLE-2's best-first tree of `num_nodes` nodes by draft path probability, with
  `num_tokens` expansions of `top_k` candidates (`dynamic_tree.py`).
Draft tokens are the drafter's top-ranked ones (deterministic trees): lossless under every
lossless verifier, greedy or sampling.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from warpdecode.decoding.drafters.dynamic_tree import grow_dynamic_tree
from warpdecode.decoding.protocols import AcceptResult, DecodeState
from warpdecode.decoding.registry import register
from warpdecode.decoding.tree import DraftTree
from warpdecode.decoding.tree_shapes import RankPath
from warpdecode.errors import ConfigError
from warpdecode.metrics.drafting import chain
from warpdecode.models.cache import KVCache
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.eagle import EagleNet
from warpdecode.models.transformer import Transformer

TREES = ("static", "chain", "dynamic")


def ancestor_mask(parents: list[int]) -> Tensor:
    """(1, n, n) bool: entry i sees itself and its ancestors (`parents[i]` < i, -1 for none)."""
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] |= mask[p]
    return mask[None]


@register("drafter", "eagle")
class EagleDraft:
    needs_training = True

    def __init__(self, path: str, tree: str = "static", num_nodes: int | None = None, num_tokens: int = 5,
                 top_k: int = 4) -> None:
        """Args:
        path: a drafter package trained with `warpdecode fit --config configs/drafters/eagle.yaml`.
        tree: `static` (the tree stored with the drafter), `chain` or `dynamic` (see the module doc).
        num_nodes: tree size (default: the stored tree's size for `static`, 16 for `dynamic`).
        num_tokens: chain length for `chain`; draft forwards (expansions) for `dynamic`.
        top_k: candidates per expanded node for `dynamic`.
        """
        if tree not in TREES:
            raise ConfigError(f"eagle tree must be one of {', '.join(TREES)}, got {tree!r}")
        for name, value in (("num_nodes", num_nodes), ("num_tokens", num_tokens), ("top_k", top_k)):
            if value is not None and value < 1:
                raise ConfigError(f"eagle {name} must be >= 1, got {value}")
        if not Path(path).exists():
            raise ConfigError(f"eagle drafter package {path!r} not found")
        self.path, self.tree, self.num_nodes, self.num_tokens, self.top_k = path, tree, num_nodes, num_tokens, top_k
        self.needs_hidden_states: tuple[int, ...] = ()
        self.package: DrafterPackage | None = None
        self.net: EagleNet | None = None
        self.checked: Transformer | None = None
        self.shape: list[RankPath] = []
        self.cache: KVCache | None = None
        self.committed = 0
        """True pairs in the draft cache."""
        self.pairs: tuple[Tensor, list[int]] | None = None
        """Pairs not yet fed: target features (m, C) and the token after each."""

    def prepare(self, target: Transformer) -> None:
        if self.package is None:
            self.package = DrafterPackage.load(self.path, "eagle")
        if self.checked is not target:
            self.package.check_target(target)
            config = self.package.config
            net = EagleNet(target.config, config["draft_vocab_size"], config["d_ff"])
            missing, unexpected = net.load_state_dict(self.package.weights, strict=False)
            if unexpected or set(missing) != {"layer.lm_head.weight"}:
                raise ConfigError(f"{self.path}: drafter weights do not match its config "
                                  f"(missing {missing[:4]}, unexpected {unexpected[:4]})")
            net.tie_head(target)
            net.to(device=target.embed.weight.device, dtype=target.embed.weight.dtype).eval()
            net.layer.pack_for_cpu_inference()
            net.fc.pack()
            self.net, self.checked = net, target
            self.needs_hidden_states = (target.config.n_layer,)
            self.shape = self.tree_shape()

    def tree_shape(self) -> list[RankPath]:
        assert self.package is not None
        if self.tree == "chain":
            return chain(self.num_tokens)
        stored = [tuple(p) for p in self.package.tree.get("rank_paths", [])]
        if self.tree == "static" and not stored:
            raise ConfigError(f"{self.path} stores no draft tree (trained without validation); use tree=chain or dynamic")
        return stored[: self.num_nodes] if self.num_nodes is not None else stored

    def start(self, state: DecodeState) -> None:
        assert self.net is not None, "prepare() must run first"
        self.cache = KVCache.for_model(self.net.config, 1, state.cache.max_len, dtype=self.net.fc.weight.dtype,
                                       device=state.cache.k[0].device)
        self.committed = 0
        features = state.hidden_states[self.needs_hidden_states[0]]  # (T_prompt, C): after each prompt token
        self.pairs = (features, state.tokens[1:])

    def observe(self, state: DecodeState, result: AcceptResult) -> None:
        # The verify forward's features after the old pending token and each accepted node; the
        # token after each is the next accepted token, then the bonus token.
        self.pairs = (state.hidden_states[self.needs_hidden_states[0]], result.tokens)

    def run(self, features: Tensor, tokens: list[int], depths: list[int], mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """Feed pairs after the committed ones; (n, C) predicted features and (n, N) draft logits.

        Args:
            features: (n, C) input features; `depths`: position offset of each pair after the committed ones.
            mask: (1, n, n) bool among the new pairs, None for causal.
        """
        assert self.net is not None and self.checked is not None and self.cache is not None
        positions = torch.tensor([[self.committed + d for d in depths]], device=features.device)
        hidden, logits = self.net(features[None], torch.tensor([tokens], device=features.device), self.checked.embed,
                                  positions, self.cache, mask)
        return hidden[0], logits[0]

    @torch.inference_mode()
    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        assert self.net is not None and self.cache is not None and self.pairs is not None, "start() must run first"
        features, tokens = self.pairs
        self.pairs = None
        feature, logits = self.run(features, tokens, list(range(1, len(tokens) + 1)), None)
        self.committed += len(tokens)
        root = (feature[-1], logits[-1])  # after the pending token
        if budget < 1:
            return DraftTree.empty()
        tree = self.dynamic(root, budget) if self.tree == "dynamic" else self.fill(root, budget)
        self.cache.truncate(self.committed)
        return tree

    def full_logits(self, logits: Tensor) -> Tensor:
        """(N,) draft-vocabulary logits → (V,) target-vocabulary logits, -inf outside the draft vocabulary."""
        assert self.net is not None and self.checked is not None
        full = torch.full((self.checked.config.vocab_size,), float("-inf"), dtype=logits.dtype, device=logits.device)
        full[self.net.draft_vocab] = logits
        return full

    def fill(self, root: tuple[Tensor, Tensor], budget: int) -> DraftTree:
        """The static shape's nodes, filled depth by depth; one draft forward per depth."""
        assert self.net is not None
        shape = self.shape[:budget]
        index = {path: i for i, path in enumerate(shape)}
        parents = [index[p[:-1]] if len(p) > 1 else -1 for p in shape]
        expand = {index[p[:-1]] for p in shape if len(p) > 1}  # nodes with children
        vocab = self.net.draft_vocab
        width = min(1 + max((p[-1] for p in shape), default=0), vocab.numel())  # candidates ranked per node
        ranked: dict[int, list[int]] = {-1: vocab[root[1].topk(width).indices].tolist()}
        outputs: dict[int, Tensor] = {-1: root[0]}
        tokens = [0] * len(shape)
        depth_of = [len(p) for p in shape]
        for depth in range(1, max(depth_of, default=0) + 1):
            level = [i for i in range(len(shape)) if depth_of[i] == depth]
            for i in level:
                tokens[i] = ranked[parents[i]][shape[i][-1]]
            grow = [i for i in level if i in expand]
            if not grow:
                continue
            fed = [i for i in range(len(shape)) if i in expand and depth_of[i] <= depth]  # expanded nodes so far
            local = {node: j for j, node in enumerate(fed)}
            inputs = torch.stack([outputs[parents[i]] for i in fed])
            mask = ancestor_mask([local.get(parents[i], -1) for i in fed])
            hidden, logits = self.run(inputs, [tokens[i] for i in fed], [depth_of[i] for i in fed], mask)
            self.cache.truncate(self.committed)  # type: ignore[union-attr]
            for i in grow:
                outputs[i] = hidden[local[i]]
                ranked[i] = vocab[logits[local[i]].topk(width).indices].tolist()
        return DraftTree(torch.tensor(tokens, dtype=torch.int64), torch.tensor(parents, dtype=torch.int64))

    def dynamic(self, root: tuple[Tensor, Tensor], budget: int) -> DraftTree:
        """EAGLE-2's dynamic tree: best-first by draft path probability (`grow_dynamic_tree`)."""
        outputs: dict[tuple[int, ...], Tensor] = {(): root[0]}

        def expand(path: list[int]) -> Tensor:
            inputs = torch.stack([outputs[tuple(path[:j])] for j in range(len(path))])
            hidden, logits = self.run(inputs, path, list(range(1, len(path) + 1)), None)
            self.cache.truncate(self.committed)  # type: ignore[union-attr]
            outputs[tuple(path)] = hidden[-1]
            return self.full_logits(logits[-1])

        return grow_dynamic_tree(self.full_logits(root[1]), expand, min(self.num_nodes or 16, budget),
                                 self.num_tokens, self.top_k)
