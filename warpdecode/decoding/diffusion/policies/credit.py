"""CreditDecoding: trace credits. Each position accumulates credit for the token it keeps
predicting (credit ← decay · credit + p^power for the current top-1 token), and the logits fused
with the credit (logits + weight · log(1 + credit)) decide: positions whose fused top-1
probability clears the threshold commit, with the fused top-1 token. Correct but underconfident
tokens that the model has settled on for several steps pass sooner. Lossy.
"""

from __future__ import annotations

import torch
from torch import Tensor

from warpdecode.decoding.diffusion.protocols import Commit, StatelessPolicy, StepView
from warpdecode.decoding.diffusion.selection import ensure_progress
from warpdecode.decoding.registry import register
from warpdecode.errors import ConfigError


@register("commit_policy", "credit")
class CreditCommit(StatelessPolicy):
    lossless = False

    def __init__(self, threshold: float = 0.9, decay: float = 0.7, weight: float = 0.5, power: float = 0.5) -> None:
        if not 0.0 < threshold <= 1.0 or not 0.0 <= decay < 1.0 or weight < 0 or power <= 0:
            raise ConfigError(f"need 0 < threshold <= 1, 0 <= decay < 1, weight >= 0, power > 0; got "
                              f"{threshold}, {decay}, {weight}, {power}")
        self.threshold, self.decay, self.weight, self.power = threshold, decay, weight, power
        self.credit: Tensor | None = None  # (B, L, V)

    def reset(self, batch: int, length: int) -> None:
        self.credit = None

    def select(self, view: StepView) -> Commit:
        if self.credit is None:
            self.credit = torch.zeros_like(view.logits)
        top1 = torch.zeros_like(view.logits).scatter_(-1, view.tokens[..., None], view.confidence[..., None] ** self.power)
        self.credit = self.decay * self.credit + top1 * view.masked[..., None]
        fused = (view.logits + self.weight * self.credit.log1p()).softmax(-1)  # (B, L, V)
        confidence, tokens = fused.max(-1)
        chosen = view.active & (confidence > self.threshold)
        return Commit(ensure_progress(chosen, confidence, view.active), tokens)
