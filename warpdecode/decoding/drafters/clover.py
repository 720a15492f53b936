"""Clover drafting: regressive heads with an attention decoder over the target's augmented features
(`models/clover.py`).

Each step the drafter first runs the target features of the positions the last verification
committed through its augmenting block (its own KV cache) and appends their decoder keys/values to
the context. Then it fills the tree depth by depth: one decoder step per depth runs every node to
expand at that depth, each reading its parent's state and its own token, and attending only to the
committed context, so nodes never see each other and no draft entry ever enters a cache.

Tree shapes (`tree=`): `static` (default, the tree stored with the drafter, cut with `num_nodes`;
`auto` sizes it for this machine) and `chain` (`num_tokens`), as every packaged drafter (`learned.py`).
On an ONNX Runtime target the network runs as the graphs exported into an inference package
(`runtime.onnx_drafters.OnnxClover`) when the package has them.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from warpdecode.decoding.drafters.learned import PackagedDrafter, ShapeLayout, fill_shape, ranked_tokens
from warpdecode.decoding.protocols import AcceptResult, DecodeState
from warpdecode.decoding.registry import register
from warpdecode.decoding.tree import DraftTree
from warpdecode.models.cache import KVCache
from warpdecode.models.clover import CloverNet
from warpdecode.runtime.onnx_drafters import OnnxClover


@register("drafter", "clover")
class CloverDrafter(PackagedDrafter[CloverNet]):
    kind = "clover"
    net_class = CloverNet
    onnx_graphs = True

    def __init__(self, path: str, tree: str = "static", num_nodes: int | str | None = None, num_tokens: int = 4,
                 lookup: int = 0, lookup_scale: bool = True) -> None:
        """Args:
        path: a drafter package trained with `warpdecode fit --config configs/drafters/clover.yaml`.
        tree: `static` (the tree stored with the drafter) or `chain`.
        num_nodes: static tree size (default: the stored tree's); `auto`: the size with the most expected
            tokens per second on this machine, from the stored τ per size and the measured verify latency.
        num_tokens: chain length for `chain`.
        lookup: fuse a prompt-lookup chain of up to this many tokens into every proposal whose context
            has a match (0: off).
        lookup_scale: cut the lookup chain after a shorter match in proportion to the match
            (`prompt_lookup.scaled_length`: 4, 7 and 10 tokens of `lookup=10` after 1-, 2- and
            3-token matches); false: up to `lookup` tokens after any match.
        """
        super().__init__(path, tree, num_nodes, num_tokens, lookup, lookup_scale)
        self.augment_cache: KVCache | None = None
        self.context: KVCache | None = None
        """The decoder's keys/values of every committed position (one layer)."""
        self.features: Tensor | None = None
        """Target features (m, C) of the positions committed since the last proposal."""
        self.last_state: Tensor | None = None
        """(C,) augmented state of the last committed position."""
        self.graphs: OnnxClover | None = None
        """The network's ONNX graphs, used when the target is not a PyTorch model and they exist."""

    def attach_graphs(self, net: CloverNet, onnx: bool) -> None:
        self.graphs = OnnxClover.find(Path(self.path), net) if onnx else None

    def start(self, state: DecodeState) -> None:
        assert self.net is not None, "prepare() must run first"
        device, dtype = state.cache.k[0].device, self.net.fc.weight.dtype
        self.augment_cache = KVCache.for_model(self.net.config, 1, state.cache.max_len, dtype=dtype, device=device)
        self.context = KVCache.for_model(self.net.config, 1, state.cache.max_len, dtype=dtype, device=device)
        self.features = state.hidden_states[self.needs_hidden_states[0]]  # (T_prompt, C): after each prompt token
        self.last_state = None

    def observe(self, state: DecodeState, result: AcceptResult) -> None:
        # The verify forward's features of the old pending token and each accepted node: the positions
        # this step committed.
        self.features = state.hidden_states[self.needs_hidden_states[0]]

    def extend_context(self) -> None:
        """Run the newly committed features through the augmenting block into the decoder's context."""
        assert self.net is not None and self.augment_cache is not None and self.context is not None
        assert self.features is not None, "start() must run first"
        features, self.features = self.features.to(self.net.fc.weight.dtype), None
        committed = int(self.context.lengths[0])
        positions = torch.arange(committed, committed + features.shape[0], device=features.device)[None]
        if self.graphs is not None:
            states, keys, values = self.graphs.augmented(features[None], positions, self.augment_cache)
        else:
            states = self.net.augmented(features[None], positions, self.augment_cache)
            keys, values = self.net.context_kv(states, positions)
        plan = self.context.plan_write(keys.shape[2])
        self.context.write(0, keys, values, plan)
        self.context.advance(plan)
        self.last_state = states[0, -1]

    def step(self, states: Tensor, tokens: list[int], depth: int) -> tuple[Tensor, Tensor]:
        """Decoder states (M, C) after each of `tokens` at `depth` (1: the pending token) from `states`
        (M, C), and their draft-vocabulary logits (M, N)."""
        net, target, context = self.net, self.checked, self.context
        assert net is not None and target is not None and context is not None
        committed = int(context.lengths[0])
        device = states.device
        positions = torch.full((len(tokens),), committed - 1 + depth, dtype=torch.int64, device=device)
        embeds = target.embed(torch.tensor(tokens, device=device))  # (M, C)
        keys, values = context.k[0, 0, :, :committed], context.v[0, 0, :, :committed]  # (Hkv, S, D)
        if self.graphs is not None:
            return self.graphs.step(states, embeds, positions, keys, values)
        out = net.step(states[None], embeds[None], positions[None], keys[None], values[None])[0]
        return out, net.logits(out)

    @torch.inference_mode()
    def draft(self, state: DecodeState, budget: int) -> DraftTree:
        assert self.net is not None, "start() must run first"
        self.extend_context()
        if budget < 1:
            return DraftTree.empty()
        assert self.last_state is not None
        net = self.net
        layout = ShapeLayout.of(self.shape[:budget])
        root, root_logits = self.step(self.last_state[None], [state.tokens[-1]], 1)  # after the pending token
        states: dict[int, Tensor] = {-1: root[0]}

        def rank_children(depth: int, grow: list[int], tokens: list[int]) -> list[list[int]]:
            parents = torch.stack([states[layout.parents[i]] for i in grow])
            out, logits = self.step(parents, [tokens[i] for i in grow], depth + 1)
            states.update(zip(grow, out))
            return ranked_tokens(logits, net.draft_vocab, layout.width)

        return fill_shape(layout, ranked_tokens(root_logits, net.draft_vocab, layout.width)[0], rank_children)
