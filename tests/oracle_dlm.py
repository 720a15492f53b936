"""A stand-in diffusion LM whose predictions and confidences are set by the test."""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import Tensor, nn

from warpdecode.models.backbone import BackboneOutput
from warpdecode.models.config import ModelConfig

MASK, EOS, V = 1, 0, 16


class OracleDLM:
    """Predicts `truth(step)` (B, L) at every position with probability `confidence(step)` (B, L), the
    rest of the mass spread evenly over the other tokens except the mask token (which a trained model
    never predicts); records the token state of every forward."""

    def __init__(self, truth: Tensor | Callable[[int], Tensor], confidence: Tensor | Callable[[int], Tensor]) -> None:
        self.config = ModelConfig(vocab_size=V, n_layer=1, n_head=1, d_model=8, d_ff=8, max_seq_len=64, causal=False,
                                  mask_token_id=MASK)
        self.embed = nn.Embedding(V, 8)
        self.truth = truth if callable(truth) else (lambda step: truth)
        self.confidence = confidence if callable(confidence) else (lambda step: confidence)
        self.seen: list[Tensor] = []

    def __call__(self, tokens: Tensor, attention_mask: Tensor | None = None, **_: object) -> BackboneOutput:
        step = len(self.seen)
        truth, c = self.truth(step), self.confidence(step)  # (B or 1, L) each: one row serves every row
        truth, c = truth.expand(tokens.shape[0], -1), c.expand(tokens.shape[0], -1)
        assert tokens.shape == truth.shape
        self.seen.append(tokens.clone())
        rest = ((1 - c) / (V - 2)).log()[..., None].expand(*tokens.shape, V).clone()  # (B, L, V)
        rest[..., MASK] = -math.inf
        logits = rest.scatter(-1, truth[..., None], c.log()[..., None])
        return BackboneOutput(logits=logits, hidden_states={})


def gap(c: float) -> float:
    """Top-2 log-probability gap of a position predicted with confidence c."""
    return math.log(c) - math.log((1 - c) / (V - 2))
