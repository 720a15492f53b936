"""Fixed schedule: commit the N most confident masked positions of the block per step (LLaDA).

With one token per step this is static decoding, the reference every parallel policy is measured
against (and `lossless` with respect to); more tokens per step divide the steps by N blindly.
"""

from __future__ import annotations

from warpdecode.decoding.diffusion.protocols import Commit, StatelessPolicy, StepView
from warpdecode.decoding.diffusion.selection import top_k_active
from warpdecode.decoding.registry import register
from warpdecode.errors import ConfigError


@register("commit_policy", "fixed")
class FixedCommit(StatelessPolicy):
    lossless = True  # at the default of one token per step; the instance says for its own setting

    def __init__(self, tokens_per_step: int = 1) -> None:
        if tokens_per_step < 1:
            raise ConfigError(f"tokens_per_step must be >= 1, got {tokens_per_step}")
        self.tokens_per_step = tokens_per_step
        self.lossless = tokens_per_step == 1

    def select(self, view: StepView) -> Commit:
        return Commit(top_k_active(view.confidence, view.active, self.tokens_per_step), view.tokens)
