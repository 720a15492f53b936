"""Quantised self-speculation: the target's own int4 or int8 weight-only copy drafts for its fp32 self.

A quantised copy agrees with the full-precision model on most tokens, and a decode step of the
copy reads an eighth (int4) or a quarter (int8) of the weight bytes, so on a memory-bound CPU it
drafts a chain (or a top-k tree) at a fraction of a target step. The fp32 target verifies, so the
output is exactly the target's. No training, no second model to ship; the copy's weights cost 1/8
or 1/4 of the fp32 linear weights in memory plus an int8 LM head (embeddings and norms are shared
with the target); built once per target. Drafting is the draft model's (`draft_model.py`);
optionally only the first `layers` blocks are kept (layer skip).

On a quantised target (`--dtype q8|q4`) the copy drafts for the quantised target: int4_self on a q8
target re-quantises its int8 weights to int4; on a target already at (or below) the copy's bits the
copy would be the target itself, so it needs `layers=N` and then drafts with the target's own first
N quantised blocks and head (shared, no extra memory).

With a stop rule (`stop=`, `chain_stop.py`) the chain has no fixed length, at most `num_tokens`:
`acceptance` (SpecDec++, the default with `acceptance_head`, a head trained with
`configs/controls/specdec-pp.yaml`) stops once the predicted probability that some token of the chain
is rejected exceeds `stop_threshold`; `entropy` drafts while the rolling entropy of the draft stays low;
`router` drafts while the head predicts each token accepted. The rules read only the drafter's own
state, so every lossless verifier stays lossless. With the lossy `trust` verifier they become Entropy
Adaptive Decoding (`stop=entropy`) and its learned router (`stop=router`): the int4 copy writes the
tokens it is sure of, unverified, and the fp32 model writes the rest.

Because the draft has the target's architecture, its KV cache is copied from the target's
instead of being computed: the draft never prefills the prompt, and every committed position
holds the target's exact keys and values, which raises acceptance. Only the pending token and the
draft's own proposals run through the quantised copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

import torch
from torch import Tensor

from warpdecode.decoding.drafters.chain_stop import StopRule, build_stop_rule, check_stop_options
from warpdecode.decoding.drafters.draft_model import DraftModelDrafter, first_layers, propose_children
from warpdecode.decoding.protocols import DecodeState
from warpdecode.decoding.registry import register
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.acceptance_head import AcceptanceHead, AcceptanceHeadConfig
from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.quantized import Bits, quantized_copy


class QuantizedSelfDrafter(DraftModelDrafter):
    bits: ClassVar[Bits]
    controls: ClassVar[Mapping[str, str]] = MappingProxyType({"acceptance_head": "acceptance_head"})

    def __init__(self, num_tokens: int = 4, top_k: int = 1, layers: int | None = None,
                 num_nodes: int | None = None, acceptance_head: str | None = None,
                 stop: str | None = None, stop_threshold: float | None = None, entropy_window: int = 4) -> None:
        """Args:
        num_tokens: draft depth per step (the chain length when `top_k=1`; the longest chain with a
            stop rule).
        top_k: siblings per level; above 1 the draft is a tree of `top_k * num_tokens` nodes.
        layers: keep only the target's first `layers` blocks in the quantised draft (default: all).
        num_nodes: grow a dynamic tree of this many nodes instead (DySpec; greedy decoding only).
        acceptance_head: a SpecDec++ acceptance head package (for `stop=acceptance` or `stop=router`).
        stop: the chain's stop rule: `acceptance` (the default with `acceptance_head`), `router` or
            `entropy`; none: a fixed `num_tokens` chain.
        stop_threshold: the rule's threshold: P(some drafted token is rejected) for `acceptance`
            (default 0.5), the least predicted acceptance of a token for `router` (0.5), the largest
            rolling mean entropy in nats for `entropy` (1.0).
        entropy_window: drafted positions in the rolling entropy of `stop=entropy`.
        """
        self.model_source, self.layers = None, None
        self.init_drafting(num_tokens, top_k, num_nodes=num_nodes)
        self.stop = stop or ("acceptance" if acceptance_head is not None else None)
        if self.stop is None:
            if stop_threshold is not None:
                raise ConfigError(f"{self.name} stop_threshold needs a stop rule (stop= or acceptance_head=)")
        else:
            if top_k != 1 or num_nodes is not None or layers is not None:
                raise ConfigError(f"{self.name} stop={self.stop} stops a chain of the full quantised copy; "
                                  "it takes neither top_k, num_nodes nor layers")
            stop_threshold = check_stop_options(self.stop, stop_threshold, entropy_window,
                                                acceptance_head is not None, self.name)
        self.head_path, self.stop_threshold, self.entropy_window = acceptance_head, stop_threshold, entropy_window
        self.rule: StopRule | None = None
        self.keep_layers = layers
        self.source: Backbone | None = None
        self.synced = 0
        """Leading positions of the draft cache that hold the target's keys/values."""

    def prepare(self, target: Backbone) -> None:
        if self.draft is None or self.source is not target:
            weights = target.torch_model()
            held = weights.weight_bits
            if self.keep_layers is None and held is not None and held <= self.bits:
                raise CapabilityError(f"{self.name} on an int{held} target: the target's weights are no larger than "
                                      f"an int{self.bits} copy; give layers=N (1..{weights.config.n_layer - 1}) to "
                                      "draft with its first N blocks")
            source = weights if self.keep_layers is None else first_layers(weights, self.keep_layers)
            self.draft = quantized_copy(source, self.bits)
            self.source = target
            if self.stop is not None:
                assert self.stop_threshold is not None
                head = None if self.head_path is None else load_acceptance_head(self.head_path, target)
                self.rule = build_stop_rule(self.stop, self.stop_threshold, self.entropy_window, head)

    def start(self, state: DecodeState) -> None:
        super().start(state)
        self.synced = 0
        if self.rule is not None:
            self.rule.start_request()

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        self.sync_cache(state.cache)
        if self.rule is None:
            return super().propose(state, budget)
        return self.propose_until_stop(state, budget, self.rule)

    @torch.inference_mode()
    def propose_until_stop(self, state: DecodeState, budget: int, rule: StopRule) -> DraftTree:
        """A chain of up to min(budget, num_tokens) tokens, ended by `rule`."""
        assert self.draft is not None and self.cache is not None
        limit = min(budget, self.num_tokens)
        if limit < 1:
            return DraftTree.empty()
        rule.start_chain()
        feed = state.tokens[int(self.cache.lengths[0]) :]  # committed tokens the draft has not run, pending last
        tokens: list[int] = []
        probs: list[Tensor] = []
        while True:
            logits, hidden = self.run_draft_with_state(feed)
            decision = rule.decide(logits, hidden)
            if not decision.keep:
                break
            (token,), q = propose_children(logits, 1, state.sampler)
            tokens.append(token)
            if q is not None:
                probs.append(q)
            if len(tokens) == limit or not decision.go_on:
                break
            self.fed.append(token)
            feed = [token]
        if not tokens:
            return DraftTree.empty()
        parents = torch.arange(-1, len(tokens) - 1)
        return DraftTree(torch.tensor(tokens), parents, torch.cat(probs) if probs else None)

    def run_draft_with_state(self, tokens: list[int]) -> tuple[Tensor, Tensor]:
        """Feed `tokens` after the draft's cached positions: (1, V) logits and (1, C) final normed
        hidden state after the last one."""
        assert self.draft is not None and self.cache is not None
        L = self.draft.config.n_layer
        out = self.draft(torch.tensor([tokens], device=self.draft.embed.weight.device), cache=self.cache,
                         hidden_layers=(L,), logits_slice=slice(-1, None))
        return out.logits[0], out.hidden_states[L][0, -1:]

    def sync_cache(self, target_cache: KVCache) -> None:
        """Copy the target's keys/values of the committed positions the draft cache lacks."""
        assert self.cache is not None and self.draft is not None
        committed = int(target_cache.lengths[0])
        self.cache.copy_from(target_cache, list(range(self.draft.config.n_layer)), self.synced, committed)
        self.synced = committed
        self.fed = []


def load_acceptance_head(path: str, target: Backbone) -> AcceptanceHead:
    """The trained head of an `acceptance_head` package, checked to be trained for `target`."""
    package = DrafterPackage.load(path, "acceptance_head")
    package.check_target(target)
    head = AcceptanceHead.from_config(AcceptanceHeadConfig.from_dict(package.config, f"{path}/drafter.json"))
    head.load_state_dict(package.weights)
    return head.eval()


@register("drafter", "int8_self")
class Int8SelfDrafter(QuantizedSelfDrafter):
    """Per-channel int8 weights in every linear layer."""

    bits: ClassVar[Bits] = 8


@register("drafter", "int4_self")
class Int4SelfDrafter(QuantizedSelfDrafter):
    """Group-wise int4 weights (groups of 32) in the blocks, int8 in the LM head."""

    bits: ClassVar[Bits] = 4

    def __init__(self, num_tokens: int = 6, top_k: int = 1, layers: int | None = None,
                 num_nodes: int | None = None, acceptance_head: str | None = None,
                 stop: str | None = None, stop_threshold: float | None = None, entropy_window: int = 4) -> None:
        """Args as for `int8_self`; a longer default chain, since the int4 draft step is cheaper
        (its step costs less than int8_self's, so more drafted tokens pay for themselves)."""
        super().__init__(num_tokens, top_k, layers, num_nodes, acceptance_head, stop, stop_threshold, entropy_window)
