"""Prophet: early answer convergence. While decoding with a base schedule, go all-in (commit every
remaining masked position of the answer at once) when the mean top-2 log-probability gap over the
masked positions clears a threshold that falls as decoding progresses. Lossy.

Thresholds apply by the fraction of the answer already committed: below 1/3, below 2/3, the rest.
"""

from __future__ import annotations

import torch

from warpdecode.decoding.diffusion.protocols import Commit, StatelessPolicy, StepView
from warpdecode.decoding.diffusion.selection import top2_gap, top_k_active
from warpdecode.decoding.registry import register
from warpdecode.errors import ConfigError


@register("commit_policy", "prophet")
class ProphetCommit(StatelessPolicy):
    lossless = False

    def __init__(self, early_gap: float = 7.5, middle_gap: float = 5.0, late_gap: float = 2.5, tokens_per_step: int = 1) -> None:
        if not early_gap >= middle_gap >= late_gap > 0:
            raise ConfigError(f"need early_gap >= middle_gap >= late_gap > 0, got {early_gap}, {middle_gap}, {late_gap}")
        if tokens_per_step < 1:
            raise ConfigError(f"tokens_per_step must be >= 1, got {tokens_per_step}")
        self.gaps = torch.tensor([early_gap, middle_gap, late_gap])
        self.tokens_per_step = tokens_per_step

    def select(self, view: StepView) -> Commit:
        masked = view.masked.float()
        mean_gap = (top2_gap(view.logits) * masked).sum(1) / masked.sum(1).clamp(min=1)  # (B,)
        progress = 1 - view.masked.sum(1) / view.answer.sum(1).clamp(min=1)  # (B,)
        stage = (progress * 3).long().clamp(max=2)
        all_in = mean_gap >= self.gaps.to(mean_gap.device)[stage]  # (B,)
        chosen = top_k_active(view.confidence, view.active, self.tokens_per_step)
        return Commit(torch.where(all_in[:, None], view.masked, chosen), view.tokens)
