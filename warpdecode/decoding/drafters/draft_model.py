"""Draft-model speculative decoding: a smaller backbone with the target's tokenizer drafts a chain.

The draft is either another model (`model=`) or, as a zero-training draft, the target's own first
`layers` blocks followed by its final norm and LM head (weights shared, not copied). The draft keeps
its own KV cache, rolled back to the accepted prefix after every verification.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from torch import nn

from warpdecode.decoding.protocols import AcceptResult, DecodeState
from warpdecode.decoding.registry import register
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import ConfigError
from warpdecode.models.cache import KVCache
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.transformer import Transformer


def first_layers(target: Transformer, layers: int) -> Transformer:
    """A backbone made of the target's first `layers` blocks, final norm and head (shared weights)."""
    if not 1 <= layers < target.config.n_layer:
        raise ConfigError(f"draft layers must be in [1, {target.config.n_layer - 1}], got {layers}")
    with torch.device("meta"):
        view = Transformer(dataclasses.replace(target.config, n_layer=layers))
    view.embed, view.pos_embed, view.norm, view.lm_head = target.embed, target.pos_embed, target.norm, target.lm_head
    view.blocks = nn.ModuleList(target.blocks[:layers])
    view._head_packed = target._head_packed
    if target.config.position == "rope":
        view.inv_freq = target.inv_freq
    return view.eval()


@register("drafter", "draft_model")
class DraftModel:
    needs_hidden_states: ClassVar[tuple[int, ...]] = ()
    needs_training: ClassVar[bool] = False

    def __init__(self, model: str | None = None, layers: int | None = None, num_tokens: int = 4) -> None:
        """Args:
        model: a draft model directory or name sharing the target's tokenizer.
        layers: instead of `model`, draft with the target's first `layers` blocks (no training).
        num_tokens: chain length drafted per step.
        """
        if (model is None) == (layers is None):
            raise ConfigError("draft_model needs exactly one of model= (a draft model) or layers= (target layers)")
        if num_tokens < 1:
            raise ConfigError(f"draft_model num_tokens must be >= 1, got {num_tokens}")
        self.model_source, self.layers, self.num_tokens = model, layers, num_tokens
        self.draft: Transformer | None = None
        self.cache: KVCache | None = None

    def start(self, state: DecodeState) -> None:
        target = state.target
        if self.layers is not None:
            self.draft = first_layers(target, self.layers)
        elif self.draft is None:
            assert self.model_source is not None
            self.draft, _ = load_pretrained(self.model_source, device=target.embed.weight.device)
        if self.draft.config.vocab_size != target.config.vocab_size:
            raise ConfigError(f"draft vocabulary {self.draft.config.vocab_size} differs from the target's "
                              f"{target.config.vocab_size}: draft and target must share a tokenizer")
        self.draft.pack_for_cpu_inference()
        self.cache = KVCache.for_model(self.draft.config, 1, state.cache.max_len,
                                       dtype=target.embed.weight.dtype, device=target.embed.weight.device)

    @torch.inference_mode()
    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        assert self.draft is not None and self.cache is not None, "start() must run first"
        k = min(self.num_tokens, budget)
        if k < 1:
            return DraftTree.empty()
        device = self.draft.embed.weight.device
        unseen = state.tokens[int(self.cache.lengths[0]) :]  # committed tokens the draft has not run, pending last
        logits = self.draft(torch.tensor([unseen], device=device), cache=self.cache, logits_slice=slice(-1, None)).logits[0]
        drafted: list[int] = []
        probs = []
        sampling = state.sampler.config.do_sample
        for i in range(k):
            if sampling:
                q = state.sampler.probs(logits)  # (1, V) the distribution the token is drawn from
                drafted.append(int(torch.multinomial(q[0], 1, generator=state.sampler.generator)))
                probs.append(q[0])
            else:
                drafted.append(int(logits[0].argmax()))
            if i < k - 1:
                logits = self.draft(torch.tensor([[drafted[-1]]], device=device), cache=self.cache).logits[0]
        return DraftTree.chain(drafted, torch.stack(probs) if sampling else None)

    def observe(self, state: DecodeState, result: AcceptResult) -> None:
        assert self.cache is not None
        # Keep the draft's cache entries that match committed tokens: everything but the new pending token.
        valid = min(int(self.cache.lengths[0]), len(state.tokens) - 1)
        self.cache.truncate(valid)
