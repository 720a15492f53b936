"""Quantised self-speculation: the target's own int4 or int8 weight-only copy drafts for its fp32 self.

A quantised copy agrees with the full-precision model on most tokens, and a decode step of the
copy reads an eighth (int4) or a quarter (int8) of the weight bytes, so on a memory-bound CPU it
drafts a chain (or a top-k tree) at a fraction of a target step. The fp32 target verifies, so the
output is exactly the target's. No training, no second model to ship; the copy's weights cost 1/8
or 1/4 of the fp32 linear weights in memory plus an int8 LM head (embeddings and norms are shared
with the target); built once per target. Drafting is the draft model's (`draft_model.py`);
optionally only the first `layers` blocks are kept (layer skip).

Because the draft has the target's architecture, its KV cache is copied from the target's
instead of being computed: the draft never prefills the prompt, and every committed position
holds the target's exact keys and values, which raises acceptance. Only the pending token and the
draft's own proposals run through the quantised copy.
"""

from __future__ import annotations

from typing import ClassVar

from warpdecode.decoding.drafters.draft_model import DraftModel, first_layers
from warpdecode.decoding.protocols import DecodeState
from warpdecode.decoding.registry import register
from warpdecode.decoding.tree import DraftTree
from warpdecode.models.cache import KVCache
from warpdecode.models.quantized import Bits, quantized_copy
from warpdecode.models.backbone import Backbone


class QuantizedSelfDraft(DraftModel):
    bits: ClassVar[Bits]

    def __init__(self, num_tokens: int = 4, top_k: int = 1, layers: int | None = None,
                 num_nodes: int | None = None) -> None:
        """Args:
        num_tokens: draft depth per step (the chain length when `top_k=1`).
        top_k: siblings per level; above 1 the draft is a tree of `top_k * num_tokens` nodes.
        layers: keep only the target's first `layers` blocks in the quantised draft (default: all).
        num_nodes: grow a dynamic tree of this many nodes instead (DySpec; greedy decoding only).
        """
        self.model_source, self.layers = None, None
        self.init_drafting(num_tokens, top_k, num_nodes=num_nodes)
        self.keep_layers = layers
        self.source: Backbone | None = None
        self.synced = 0
        """Leading positions of the draft cache that hold the target's keys/values."""

    def prepare(self, target: Backbone) -> None:
        if self.draft is None or self.source is not target:
            weights = target.torch_model()
            source = weights if self.keep_layers is None else first_layers(weights, self.keep_layers)
            self.draft = quantized_copy(source, self.bits)
            self.source = target

    def start(self, state: DecodeState) -> None:
        super().start(state)
        self.synced = 0

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        self.sync_cache(state.cache)
        return super().propose(state, budget)

    def sync_cache(self, target_cache: KVCache) -> None:
        """Copy the target's keys/values of the committed positions the draft cache lacks."""
        assert self.cache is not None and self.draft is not None
        committed = int(target_cache.lengths[0])
        self.cache.copy_from(target_cache, list(range(self.draft.config.n_layer)), self.synced, committed)
        self.synced = committed
        self.fed = []


@register("drafter", "int8_self")
class Int8SelfDraft(QuantizedSelfDraft):
    """Per-channel int8 weights in every linear layer."""

    name: ClassVar[str] = "int8_self"
    bits: ClassVar[Bits] = 8


@register("drafter", "int4_self")
class Int4SelfDraft(QuantizedSelfDraft):
    """Group-wise int4 weights (groups of 32) in the blocks, int8 in the LM head."""

    name: ClassVar[str] = "int4_self"
    bits: ClassVar[Bits] = 4

    def __init__(self, num_tokens: int = 6, top_k: int = 1, layers: int | None = None,
                 num_nodes: int | None = None) -> None:
        """Args as for `int8_self`; a longer default chain, since the int4 draft step is cheaper
        (6 tokens beat 4 on Spec-Bench, docs/benchmarks.md)."""
        super().__init__(num_tokens, top_k, layers, num_nodes)
