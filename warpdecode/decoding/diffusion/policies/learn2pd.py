"""Learn2PD: a trained filter (`models/parallel_filter.py`) commits the positions of the block it
judges already final, on top of a scheduled minimum of tokens per step. Lossy.

Train the filter for a diffusion LM with `warpdecode fit --config configs/diffusion/learn2pd.yaml`;
it refuses to run on another model than the one whose trajectories it learned.
"""

from __future__ import annotations

import torch

from warpdecode.decoding.diffusion.protocols import Commit, StatelessPolicy, StepView
from warpdecode.decoding.diffusion.selection import top_k_active
from warpdecode.decoding.registry import register
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.parallel_filter import ParallelFilter, ParallelFilterConfig, block_inputs

KIND = "learn2pd"


@register("commit_policy", KIND)
class Learn2PDCommit(StatelessPolicy):
    lossless = False
    needs_training = True

    def __init__(self, path: str, accept_threshold: float = 0.96, min_tokens_per_step: int = 1) -> None:
        if not 0.0 < accept_threshold < 1.0 or min_tokens_per_step < 1:
            raise ConfigError(f"need 0 < accept_threshold < 1 and min_tokens_per_step >= 1, got {accept_threshold}, "
                              f"{min_tokens_per_step}")
        self.package = DrafterPackage.load(path, kind=KIND)
        self.filter = ParallelFilter.from_config(ParallelFilterConfig.from_dict(self.package.config,
                                                                                 f"{path}/drafter.json"))
        self.filter.load_state_dict(self.package.weights)
        self.filter.eval()
        self.accept_threshold, self.min_tokens_per_step = accept_threshold, min_tokens_per_step
        self._checked: int | None = None

    def prepare(self, model: Backbone) -> None:
        if self._checked != id(model):
            self.package.check_target(model)
            self._checked = id(model)

    @torch.inference_mode()
    def select(self, view: StepView) -> Commit:
        confidence, masked = block_inputs(view.confidence, view.masked, view.block)
        final = self.filter(confidence, masked).sigmoid() > self.accept_threshold  # (B, K)
        accepted = torch.zeros_like(view.block)
        accepted[view.block] = final.flatten()
        chosen = (view.active & accepted) | top_k_active(view.confidence, view.active, self.min_tokens_per_step)
        return Commit(chosen, view.tokens)
