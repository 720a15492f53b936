"""LocalLeap: commit high-confidence anchors, then relax the threshold in a bounded neighbourhood
around them (local determinism propagation); the relaxation decays with the distance to the
nearest anchor (progressive spatial-consistency decay). Lossy.

A masked position at distance d (1 ≤ d ≤ radius) from the nearest anchor of its row is committed
when its confidence reaches relaxed + (anchor - relaxed) · (d - 1) / radius.
"""

from __future__ import annotations

import torch

from warpdecode.decoding.diffusion.protocols import Commit, StatelessPolicy, StepView
from warpdecode.decoding.diffusion.selection import ensure_progress
from warpdecode.decoding.registry import register
from warpdecode.errors import ConfigError


@register("commit_policy", "local_leap")
class LocalLeapCommit(StatelessPolicy):
    lossless = False

    def __init__(self, anchor_threshold: float = 0.9, relaxed_threshold: float = 0.6, radius: int = 4) -> None:
        if not 0.0 < relaxed_threshold <= anchor_threshold <= 1.0:
            raise ConfigError(f"need 0 < relaxed_threshold <= anchor_threshold <= 1, got {relaxed_threshold}, "
                              f"{anchor_threshold}")
        if radius < 1:
            raise ConfigError(f"radius must be >= 1, got {radius}")
        self.anchor_threshold, self.relaxed_threshold, self.radius = anchor_threshold, relaxed_threshold, radius

    def select(self, view: StepView) -> Commit:
        anchors = view.active & (view.confidence >= self.anchor_threshold)  # (B, L)
        L = anchors.shape[1]
        index = torch.arange(L, device=anchors.device)
        gaps = (index[:, None] - index[None, :]).abs()  # (L, L)
        distance = gaps[None].masked_fill(~anchors[:, None, :], L).amin(-1)  # (B, L) to the nearest anchor
        required = self.relaxed_threshold + (self.anchor_threshold - self.relaxed_threshold) * (distance - 1) / self.radius
        neighbours = view.active & (distance >= 1) & (distance <= self.radius) & (view.confidence >= required)
        return Commit(ensure_progress(anchors | neighbours, view.confidence, view.active), view.tokens)
