"""Confidence threshold (Fast-dLLM): commit every masked position of the block whose top-1
probability exceeds the threshold, and at least the most confident one. Lossy."""

from __future__ import annotations

from warpdecode.decoding.diffusion.protocols import Commit, StatelessPolicy, StepView
from warpdecode.decoding.diffusion.selection import ensure_progress
from warpdecode.decoding.registry import register
from warpdecode.errors import ConfigError


@register("commit_policy", "threshold")
class ThresholdCommit(StatelessPolicy):
    lossless = False

    def __init__(self, threshold: float = 0.9) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ConfigError(f"threshold must be in (0, 1], got {threshold}")
        self.threshold = threshold

    def select(self, view: StepView) -> Commit:
        chosen = view.active & (view.confidence > self.threshold)
        return Commit(ensure_progress(chosen, view.confidence, view.active), view.tokens)
