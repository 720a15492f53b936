"""Momentum decoding (Lan, Su et al. 2022, "Momentum Decoding: Open-ended Text Generation As Graph
Exploration"; the authors' `ResistanceDecodingNGram`, gmftbyGMFTBY/MomentumDecoding).

The text so far (prompt included) is a walk over a directed graph whose nodes are tokens; degeneration
is a walk round a circular loop. Each step takes the `top_k` most likely tokens v of the processed
distribution p (penalties and the caller's hooks applied, no sampling warpers) and picks greedily

    argmax_v  p(v) - α · R(l(v))

where l(v) is how far v would walk back into the graph: 0 for a new node (a token not seen yet), else
the longest n ≤ `max_ngram` such that the last n-1 tokens followed by v already occur as an n-gram
(1 when only v itself was seen). R is the resistance function, R(0) = 0; `linear` (R(l) = l, the
authors' GPT2-XL table and the default with α = 0.2, k = 5, n ≤ 5) and the authors' other variants,
`log` (log_6(1 + l) / 0.2), `exp` (1.5^l / 2) and `constant` (2). α = 0 is greedy decoding.

The choice is a function of the context alone, so `MomentumLogits` also runs it as a caller's logits
processor: with a greedy-verified speculative method it gives the same tokens (docs/decoding-rules.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import Tensor

from warpdecode.decoding.registry import register
from warpdecode.decoding.rules.protocols import Decoded, DecodingRule, Emitter, one_token_per_forward
from warpdecode.decoding.sampler import Sampler
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone

Resistance = Literal["linear", "log", "exp", "constant"]
RESISTANCE: dict[str, Callable[[int], float]] = {
    "linear": lambda n: float(n),
    "log": lambda n: math.log(1 + n, 6) / 0.2,
    "exp": lambda n: 1.5**n / 2,
    "constant": lambda n: 2.0,
}


class NgramGraph:
    """Every n-gram (1 ≤ n ≤ `max_ngram`) of a token sequence, kept as the sequence grows."""

    def __init__(self, max_ngram: int, tokens: Sequence[int] = ()) -> None:
        self.max_ngram = max_ngram
        self.tokens: list[int] = []
        self.seen: set[tuple[int, ...]] = set()
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self.tokens.append(token)
            for n in range(1, min(self.max_ngram, len(self.tokens)) + 1):
                self.seen.add(tuple(self.tokens[-n:]))

    def loop_length(self, candidate: int) -> int:
        """0 when `candidate` is a new node, else the longest n-gram ending in it that the text holds.

        Example: tokens [5, 6, 7, 5, 6] → loop_length(7) = 3 ((5, 6, 7) occurs), loop_length(5) = 1,
        loop_length(9) = 0.
        """
        if (candidate,) not in self.seen:
            return 0
        for n in range(min(self.max_ngram, len(self.tokens) + 1), 1, -1):
            if tuple(self.tokens[len(self.tokens) - n + 1 :]) + (candidate,) in self.seen:
                return n
        return 1


def momentum_scores(probs: Tensor, ids: Tensor, graph: NgramGraph, alpha: float, resistance: Resistance) -> Tensor:
    """(K,) float32 momentum scores p - α R(l) of the candidates; the rule picks the first best.

    Args:
        probs: (K,) float32 the candidates' probabilities, most likely first; ids: (K,) int64 their token ids.
    """
    lengths = [graph.loop_length(t) for t in ids.tolist()]
    penalty = torch.tensor([alpha * RESISTANCE[resistance](n) if n else 0.0 for n in lengths], device=probs.device)
    return probs.float() - penalty


def _check(alpha: float, top_k: int, max_ngram: int, resistance: str) -> None:
    if not (alpha >= 0 and math.isfinite(alpha)):
        raise ConfigError(f"momentum alpha must be finite and >= 0, got {alpha}")
    if top_k < 1 or max_ngram < 1:
        raise ConfigError(f"momentum top_k and max_ngram must be >= 1, got {top_k} and {max_ngram}")
    if resistance not in RESISTANCE:
        raise ConfigError(f"momentum resistance must be one of {', '.join(RESISTANCE)}, got {resistance!r}")


class MomentumLogits:
    """Momentum decoding as a Hugging Face-style logits processor for greedy decoding: the top-k tokens
    keep their momentum score, every other token -inf, so the argmax is momentum decoding's choice."""

    def __init__(self, alpha: float = 0.2, top_k: int = 5, max_ngram: int = 5, resistance: Resistance = "linear") -> None:
        _check(alpha, top_k, max_ngram, resistance)
        self.alpha, self.top_k, self.max_ngram, self.resistance = alpha, top_k, max_ngram, resistance

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        """input_ids: (1, T) int64 the context; scores: (1, V) float logits. Returns (1, V) float32."""
        graph = NgramGraph(self.max_ngram, input_ids[0].tolist())
        probs, ids = torch.softmax(scores.float(), dim=-1)[0].topk(min(self.top_k, scores.shape[-1]))
        out = torch.full(scores.shape, float("-inf"), device=scores.device)
        out[0, ids] = momentum_scores(probs, ids, graph, self.alpha, self.resistance)
        return out


@register("rule", "momentum")
class MomentumDecoding(DecodingRule):
    def __init__(self, alpha: float = 0.2, top_k: int = 5, max_ngram: int = 5, resistance: Resistance = "linear") -> None:
        _check(alpha, top_k, max_ngram, resistance)
        self.alpha, self.top_k, self.max_ngram = alpha, top_k, max_ngram
        self.resistance: Resistance = resistance

    def decode(self, target: Backbone, prompt_ids: list[int], sampler: Sampler, emit: Emitter) -> Decoded:
        if sampler.config.do_sample:
            raise ConfigError("momentum decoding chooses greedily: it takes no --temperature")
        k = min(self.top_k, target.config.vocab_size)
        graph = NgramGraph(self.max_ngram, prompt_ids)

        def choose(logits: Tensor) -> int:
            probs, ids = torch.softmax(logits, dim=-1)[0].topk(k)  # (K,), (K,) most likely first
            token = int(ids[momentum_scores(probs, ids, graph, self.alpha, self.resistance).argmax()])
            graph.extend([token])
            return token

        return one_token_per_forward(target, prompt_ids, sampler, emit, choose)
