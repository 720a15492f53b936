"""SWIFT-style on-the-fly layer-skip self-speculation (Xia et al. 2024): the target minus some of its
layers drafts for itself, and which layers to skip is searched while decoding.

The draft is the target with `num_skip` intermediate blocks skipped (weights shared; the first and
last blocks always run), optionally over the target's int4/int8 copy (`bits`). Like the quantised
self-draft, its KV cache for committed positions is copied from the target's cache (kept layers
only), so it never prefills.

Skip-set search (SWIFT's optimisation phase, with random mutation instead of Bayesian
optimisation): after each of the first `search_steps` verifications, `candidates` mutations of the
current skip set (one skipped layer swapped for one kept layer) are scored by teacher forcing: the
candidate draft runs over the last `window` committed tokens (keys and values before them taken
from the target) and its score is how many of the target's committed next tokens it predicts. The
best set so far drafts. The search costs `candidates + 1` forwards of `window` tokens per search
step, timed like every other part of the draft. SWIFT's confidence-aware early stop of a draft is
left to the controllers (`controller=adaptive`).
"""

from __future__ import annotations

import random

import torch

from warpdecode.decoding.drafters.draft_model import DraftModelDrafter, layer_subset
from warpdecode.decoding.protocols import AcceptResult, DecodeState
from warpdecode.decoding.registry import register
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache
from warpdecode.models.quantized import quantized_copy
from warpdecode.models.transformer import Transformer


def initial_skip(n_layer: int, num_skip: int) -> list[int]:
    """`num_skip` blocks spread evenly over the middle (never the first or the last).

    Example: 10 layers, 3 skipped → [2, 4, 6]."""
    middle = list(range(1, n_layer - 1))
    step = len(middle) / (num_skip + 1)
    return sorted({middle[round(step * (i + 1)) - 1 if step >= 1 else i] for i in range(num_skip)})


def mutate(skip: list[int], n_layer: int, rng: random.Random) -> list[int]:
    """Swap one skipped block for one kept intermediate block."""
    kept = [layer for layer in range(1, n_layer - 1) if layer not in skip]
    if not kept:
        return list(skip)
    out = set(skip)
    out.remove(rng.choice(skip))
    out.add(rng.choice(kept))
    return sorted(out)


@register("drafter", "layer_skip")
class LayerSkipDrafter(DraftModelDrafter):

    def __init__(self, num_skip: int = 6, num_tokens: int = 4, bits: int | None = None, search_steps: int = 8,
                 candidates: int = 2, window: int = 16, seed: int = 0) -> None:
        """Args:
        num_skip: blocks the draft skips.
        num_tokens: longest draft chain per step.
        bits: draft over the target's int4 or int8 weight-only copy (default: the fp32 weights).
        search_steps: verifications after which the skip set is searched.
        candidates: skip sets tried per search step.
        window: committed tokens a candidate is scored on.
        seed: the search's random seed.
        """
        if num_skip < 1 or search_steps < 0 or candidates < 1 or window < 2:
            raise ConfigError("layer_skip needs num_skip >= 1, search_steps >= 0, candidates >= 1 and window >= 2")
        if bits not in (None, 4, 8):
            raise ConfigError(f"layer_skip bits must be 4, 8 or unset, got {bits}")
        self.model_source, self.layers = None, None
        self.init_drafting(num_tokens, 1)
        self.num_skip, self.bits, self.search_steps, self.candidates = num_skip, bits, search_steps, candidates
        self.window, self.seed = window, seed
        self.base: Transformer | None = None
        self.source: Backbone | None = None
        self.skip: list[int] = []
        self.keep: list[int] = []
        self.synced = 0
        self.steps = 0
        self.rng = random.Random(seed)

    def prepare(self, target: Backbone) -> None:
        n_layer = target.config.n_layer
        if not 1 <= self.num_skip <= n_layer - 2:
            raise ConfigError(f"layer_skip num_skip must be in [1, {n_layer - 2}] for a {n_layer}-layer target, "
                              f"got {self.num_skip}")
        if self.source is not target:
            weights = target.torch_model()
            self.base = weights if self.bits is None else quantized_copy(weights, self.bits)  # type: ignore[arg-type]
            self.source = target
        self.use_skip(initial_skip(n_layer, self.num_skip))

    def use_skip(self, skip: list[int]) -> None:
        assert self.base is not None
        self.skip = skip
        self.keep = [layer for layer in range(self.base.config.n_layer) if layer not in skip]
        self.draft = layer_subset(self.base, self.keep) if skip else self.base
        self.synced = 0  # every cached position must be recopied for the new layers

    def start(self, state: DecodeState) -> None:
        self.use_skip(self.first_skip(state))
        super().start(state)  # the draft's cache, for the layers of this skip set
        self.rng = random.Random(self.seed)
        self.steps = 0

    def first_skip(self, state: DecodeState) -> list[int]:
        """The skip set a request starts with."""
        return initial_skip(state.target.config.n_layer, self.num_skip)

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        assert self.cache is not None
        committed = int(state.cache.lengths[0])
        self.cache.copy_from(state.cache, self.keep, self.synced, committed)
        self.synced = committed
        self.fed = []
        return super().propose(state, budget)

    @torch.inference_mode()
    def score(self, state: DecodeState, keep: list[int]) -> int:
        """Committed next tokens the draft with blocks `keep` predicts over the last `window` tokens."""
        assert self.base is not None
        committed = int(state.cache.lengths[0])
        begin = max(state.prompt_len // 2, committed - self.window)
        if committed - begin < 2:
            return 0
        draft = layer_subset(self.base, keep)
        scratch = KVCache.for_model(draft.config, 1, committed, dtype=state.cache.k.dtype, device=state.cache.k.device)
        scratch.copy_from(state.cache, keep, 0, begin)
        inputs = torch.tensor([state.tokens[begin:committed]], device=state.cache.k.device)
        predicted = draft(inputs, cache=scratch).logits[0].argmax(-1)  # (T,) after each input token
        actual = torch.tensor(state.tokens[begin + 1 : committed + 1], device=predicted.device)
        return int((predicted == actual).sum())

    def observe(self, state: DecodeState, result: AcceptResult) -> None:
        super().observe(state, result)
        self.steps += 1
        if self.steps > self.search_steps:
            return
        best, best_score = self.skip, self.score(state, self.keep)
        n_layer = state.target.config.n_layer
        for _ in range(self.candidates):
            skip = mutate(best, n_layer, self.rng)
            keep = [layer for layer in range(n_layer) if layer not in skip]
            score = self.score(state, keep)
            if score > best_score:
                best, best_score = skip, score
        if best != self.skip:
            self.use_skip(best)
